/* Library-internal helpers implemented in C; not part of the public ABI. */
#ifndef MOE_SWIFT_INTERNAL_H
#define MOE_SWIFT_INTERNAL_H

#include "moe_swift.h"

/* Stores message (copied, truncated to 1023 bytes) as the calling thread's last error. */
void moe_internal_set_error(const char* message);

/* The calling thread's statistics slot behind moe_last_stats() (reset by each call). */
moe_stats* moe_internal_stats(void);

/* Brackets every exported call that runs work: at process exit, an atexit handler waits
 * for the calls in flight before the libraries' destructors run (exit.c). */
void moe_internal_call_begin(void);
void moe_internal_call_end(void);

/* Lookups in moe_options.h's tables (options.c); the library's own, not exported. */
#define MOE_OPTIONS_HIDDEN __attribute__((visibility("hidden")))
typedef enum moe_option_table {
    MOE_OPTION_TABLE_BACKEND,
    MOE_OPTION_TABLE_SCORING,
    MOE_OPTION_TABLE_ACTIVATION,
    MOE_OPTION_TABLE_DTYPE,
    MOE_OPTION_TABLE_FORMAT,
    MOE_OPTION_TABLE_ACTIVATION_QUANTIZATION
} moe_option_table;

/* The name of a row by its code; NULL if no row has it (a static string). */
MOE_OPTIONS_HIDDEN const char* moe_option_name(moe_option_table table, int32_t code);
/* The code of the row named `name`; -1 if none is. */
MOE_OPTIONS_HIDDEN int32_t moe_option_code(moe_option_table table, const char* name);
/* The moe_activation that a Hugging Face hidden_act value means; -1 if none. */
MOE_OPTIONS_HIDDEN int32_t moe_activation_of_hidden_act(const char* hidden_act);
/* Every hidden_act value that some activation accepts, space-separated. */
MOE_OPTIONS_HIDDEN const char* moe_hidden_act_names(void);
/* 1 if affine quantization has this code width / group size, else 0. */
MOE_OPTIONS_HIDDEN int32_t moe_affine_bits_allowed(int32_t bits);
MOE_OPTIONS_HIDDEN int32_t moe_affine_group_size_allowed(int32_t group_size);
/* The moe_specialisation whose kernels read weights of this format and bits. */
MOE_OPTIONS_HIDDEN int32_t moe_specialisation_of(int32_t format, int32_t bits);
/* Its host-name suffix ("f32", "q4", ..., "any"); NULL for no row. */
MOE_OPTIONS_HIDDEN const char* moe_specialisation_suffix(int32_t specialisation);
/* The moe_format that keeps tensors of ggml type `ggml_type` (MOE_GGML_TYPE_ROWS); -1 if
 * this layer reads no such type. */
MOE_OPTIONS_HIDDEN int32_t moe_format_of_ggml_type(int32_t ggml_type);
/* A ggml block format's elements and bytes per block, and its ggml type; 0 if `format` is
 * not in MOE_GGML_TYPE_ROWS (dense formats are: one element of their size). */
MOE_OPTIONS_HIDDEN int32_t moe_ggml_block_elems(int32_t format);
MOE_OPTIONS_HIDDEN int32_t moe_ggml_block_bytes(int32_t format);
MOE_OPTIONS_HIDDEN int32_t moe_ggml_type_of_format(int32_t format);

#endif
