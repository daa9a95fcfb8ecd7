// The last runtime part: names that MSL has only from some language version on, withdrawn
// from the kernel's source below it (the runtime above uses them freely). Apple's compiler
// does not know `bfloat` and its vectors before MSL 3.1 (macOS 14): a kernel compiled as
// MSL 3.0 that names them gets an unknown type here too, with the reason in its name.
#if __METAL_VERSION__ < 310
#define bfloat bfloat_needs_MSL_3_1
#define bfloat2 bfloat2_needs_MSL_3_1
#define bfloat3 bfloat3_needs_MSL_3_1
#define bfloat4 bfloat4_needs_MSL_3_1
#endif
