#include "moe_swift.h"
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
// A small layer through the C ABI: create (float32 and 4-bit experts), forward, route, the
// experts-only call, errors, destroy. Run under valgrind: no invalid access, no definite leak.
int main(void) {
    enum { E = 4, H = 64, I = 32, K = 2, T = 5 };
    static float router[E * H], gate[E * I * H], up[E * I * H], down[E * H * I], x[T * H], y[T * H], w[T * K];
    static uint32_t words[E * I * H / 8];
    static float scales[E * I * H / 32], biases[E * I * H / 32];
    static int32_t ids[T * K];
    for (int i = 0; i < E * H; i++) router[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    for (int i = 0; i < E * I * H; i++) { gate[i] = (float)((i * 5) % 11) / 110.0f; up[i] = gate[i] * 0.5f; down[i] = -gate[i]; }
    for (int i = 0; i < E * I * H / 8; i++) words[i] = 0x76543210u * (uint32_t)(i + 1);
    for (int i = 0; i < E * I * H / 32; i++) { scales[i] = 0.01f; biases[i] = -0.05f; }
    for (int i = 0; i < T * H; i++) x[i] = (float)(i % 17) / 17.0f;
    for (int i = 0; i < T * K; i++) { ids[i] = (i * 3) % E; w[i] = 0.5f; }
    int failures = 0;
    for (int variant = 0; variant < 2; variant++) {
        moe_layer_desc d;
        moe_layer_desc_init(&d);
        d.backend = MOE_BACKEND_CPU;
        d.hidden_size = H; d.intermediate_size = I; d.num_experts = E; d.top_k = K;
        d.router_weight = router; d.up_proj = up; d.down_proj = down;
        if (variant == 0) d.gate_proj = gate;
        else {
            d.gate_proj_tensor.format = MOE_FORMAT_AFFINE; d.gate_proj_tensor.bits = 4; d.gate_proj_tensor.group_size = 32;
            d.gate_proj_tensor.scale_dtype = MOE_DTYPE_F32; d.gate_proj_tensor.data = words;
            d.gate_proj_tensor.scales = scales; d.gate_proj_tensor.biases = biases;
        }
        moe_layer* layer = NULL;
        if (moe_layer_create(&d, &layer) != MOE_OK) { printf("create: %s\n", moe_last_error()); return 1; }
        failures += moe_layer_forward(layer, x, T, x, y) != MOE_OK;
        failures += moe_layer_route(layer, x, T, ids, w) != MOE_OK;
        failures += moe_layer_forward_routed(layer, x, T, ids, w, y) != MOE_OK;
        failures += moe_layer_forward(layer, x, -1, NULL, y) != MOE_ERROR_INVALID_ARGUMENT;
        moe_layer_destroy(layer);
    }
    moe_layer_desc bad;
    moe_layer_desc_init(&bad);
    moe_layer* none = NULL;
    failures += moe_layer_create(&bad, &none) != MOE_ERROR_INVALID_ARGUMENT;
    printf("%d failures\n", failures);
    return failures != 0;
}
