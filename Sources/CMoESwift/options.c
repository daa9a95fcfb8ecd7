// The lookups that Swift needs from moe_options.h's tables (Swift imports the enum
// constants but cannot expand the X-macros): names by code, codes by name, the allowed
// affine widths and group sizes, and the specialisation a weight format runs on.
#include <string.h>

#include "moe_options.h"
#include "moe_swift_internal.h"

#define NAME_CASE_(NAME, code, name, ...) case code: return name;
#define CODE_IF_(NAME, code, name, ...) if (strcmp(text, name) == 0) return code;

const char* moe_option_name(moe_option_table table, int32_t code) {
    switch (table) {
    case MOE_OPTION_TABLE_BACKEND: switch (code) { MOE_BACKEND_ROWS(NAME_CASE_) } break;
    case MOE_OPTION_TABLE_SCORING: switch (code) { MOE_SCORING_ROWS(NAME_CASE_) } break;
    case MOE_OPTION_TABLE_ACTIVATION: switch (code) { MOE_ACTIVATION_ROWS(NAME_CASE_) } break;
    case MOE_OPTION_TABLE_DTYPE: switch (code) { MOE_DTYPE_ROWS(NAME_CASE_) } break;
    case MOE_OPTION_TABLE_FORMAT: switch (code) { MOE_FORMAT_ROWS(NAME_CASE_) } break;
    case MOE_OPTION_TABLE_ACTIVATION_QUANTIZATION:
        switch (code) { MOE_ACTIVATION_QUANTIZATION_ROWS(NAME_CASE_) } break;
    }
    return NULL;
}

int32_t moe_option_code(moe_option_table table, const char* text) {
    switch (table) {
    case MOE_OPTION_TABLE_BACKEND: MOE_BACKEND_ROWS(CODE_IF_) break;
    case MOE_OPTION_TABLE_SCORING: MOE_SCORING_ROWS(CODE_IF_) break;
    case MOE_OPTION_TABLE_ACTIVATION: MOE_ACTIVATION_ROWS(CODE_IF_) break;
    case MOE_OPTION_TABLE_DTYPE: MOE_DTYPE_ROWS(CODE_IF_) break;
    case MOE_OPTION_TABLE_FORMAT: MOE_FORMAT_ROWS(CODE_IF_) break;
    case MOE_OPTION_TABLE_ACTIVATION_QUANTIZATION: MOE_ACTIVATION_QUANTIZATION_ROWS(CODE_IF_) break;
    }
    return -1;
}

// Whether `word` is one of the space-separated words of `list`.
static int has_word(const char* list, const char* word) {
    size_t n = strlen(word);
    for (const char* p = list; *p;) {
        const char* end = strchr(p, ' ');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && n > 0 && memcmp(p, word, n) == 0) return 1;
        p += len + (end != NULL);
    }
    return 0;
}

int32_t moe_activation_of_hidden_act(const char* hidden_act) {
#define ALIAS_IF_(NAME, code, name, aliases) if (has_word(aliases, hidden_act)) return code;
    MOE_ACTIVATION_ROWS(ALIAS_IF_)
#undef ALIAS_IF_
    return -1;
}

const char* moe_hidden_act_names(void) {
#define ALIASES_(NAME, code, name, aliases) " " aliases
    return MOE_ACTIVATION_ROWS(ALIASES_);
#undef ALIASES_
}

int32_t moe_affine_bits_allowed(int32_t bits) {
#define BITS_IF_(n) if (bits == n) return 1;
    MOE_AFFINE_BITS_ROWS(BITS_IF_)
#undef BITS_IF_
    return 0;
}

int32_t moe_affine_group_size_allowed(int32_t group_size) {
#define GROUP_IF_(n) if (group_size == n) return 1;
    MOE_AFFINE_GROUP_SIZE_ROWS(GROUP_IF_)
#undef GROUP_IF_
    return 0;
}

int32_t moe_specialisation_of(int32_t format, int32_t bits) {
#define SPECIALISATION_IF_(suffix, FORMAT, row_bits) \
    if (format == MOE_FORMAT_##FORMAT && (row_bits == 0 || bits == row_bits)) return MOE_SPECIALISATION_##suffix;
    MOE_SPECIALISATION_ROWS(SPECIALISATION_IF_)
#undef SPECIALISATION_IF_
    return MOE_SPECIALISATION_any;
}

const char* moe_specialisation_suffix(int32_t specialisation) {
#define SUFFIX_CASE_(suffix, ...) case MOE_SPECIALISATION_##suffix: return #suffix;
    switch (specialisation) { MOE_SPECIALISATION_ROWS(SUFFIX_CASE_) }
#undef SUFFIX_CASE_
    return NULL;
}

int32_t moe_format_of_ggml_type(int32_t ggml_type) {
#define FORMAT_IF_(FORMAT, type, ...) if (ggml_type == type) return MOE_FORMAT_##FORMAT;
    MOE_GGML_TYPE_ROWS(FORMAT_IF_)
#undef FORMAT_IF_
    return -1;
}

#define GGML_COLUMN_(column)                                                           \
    int32_t moe_ggml_##column(int32_t format) {                                       \
        MOE_GGML_TYPE_ROWS(GGML_COLUMN_IF_##column##_)                                \
        return 0;                                                                      \
    }
#define GGML_COLUMN_IF_block_elems_(FORMAT, type, elems, bytes) if (format == MOE_FORMAT_##FORMAT) return elems;
#define GGML_COLUMN_IF_block_bytes_(FORMAT, type, elems, bytes) if (format == MOE_FORMAT_##FORMAT) return bytes;
#define GGML_COLUMN_IF_type_of_format_(FORMAT, type, elems, bytes) if (format == MOE_FORMAT_##FORMAT) return type;
GGML_COLUMN_(block_elems)
GGML_COLUMN_(block_bytes)
GGML_COLUMN_(type_of_format)
