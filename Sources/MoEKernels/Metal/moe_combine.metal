// placeholder
#include "moe_kernel_params.h"
#include "moe_common.h"
