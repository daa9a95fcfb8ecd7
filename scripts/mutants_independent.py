"""Mutants designed independently of the tests (issue 46): a reviewer given the product
code and docs (Sources/, SoftMetal/Sources/, python/moe_swift/, docs/, README) but not
tests/, scripts/mutate.py or its results planted these, each with the effect a user would
see. The sixth field, added afterwards, names the test files of the mutant's area that run
first; a mutant they miss runs the whole suites (`--full`) before it counts as a survivor.

    python3 scripts/mutate.py --set independent
    python3 scripts/mutate.py --set independent --report
"""

INDEPENDENT = [
    # A GGUF key given as a per-layer array (e.g. feed_forward_length / expert_feed_forward_length) gives every layer layer 0's value, so layers with a different width get the wrong intermediate size (shape errors or wrong configuration).
    ("ind-gguf-perlayer-first", "gguf-metadata",
     "Sources/MoEKernels/Checkpoint/GGUFCheckpoint.swift",
     "        return values[layer]\n",
     "        return values[0]\n",
     ("pytest tests/python/test_gguf.py",)),

    # A glm4moe GGUF file without blk.N.exp_probs_b.bias loads silently (routing without the selection bias) instead of being refused as llama.cpp's loader would.
    ("ind-gguf-glm-selbias-optional", "gguf-required-tensors",
     "Sources/MoEKernels/Checkpoint/GGUFLayerReader.swift",
     'arch.selectionBiasRequired ? try requiredVector("exp_probs_b.bias", [e])',
     'arch.selectionBiasRequired ? try vector("exp_probs_b.bias", [e])',
     ("pytest tests/python/test_gguf.py",)),

    # With 8-bit activations on the CPU (AVX2 integer path), Q4_1 / Q5_1 (and other biased 4-bit) weights lose their minimum/bias term in the blocks past the last 256-element octet (all of a row shorter than 256), so decode outputs are off.
    ("ind-q8-cpu-tail-bias", "q8-activations",
     "Sources/CMoECPU/formats/q8_avx2.c",
     "            tail = fmaf(bias, x_sum(a, i, k), tail);\n",
     "",
     ("pytest tests/python/test_q8_activations.py tests/python/test_cpu_isa.py",)),

    # On the Metal/SoftMetal backend with activation_quantization="q8" and top_k > 1, only the first `tokens` pair rows of the expert activations are quantized before the down product, so the other slots' down products use unquantized inputs and differ from the CPU/reference q8 results.
    ("ind-metal-q8-down-rows", "q8-activations",
     "Sources/MoEKernels/MetalBackend/MetalLayerEncoder.swift",
     "rows: tokens * c.topK, cols: c.intermediateSize)",
     "rows: tokens, cols: c.intermediateSize)",
     ("pytest tests/python/test_metal_q8.py",)),

    # Encode API: arrays that merely touch (a normed output placed right after the output in the same buffer) are reported as overlapping, so a valid encodeForward is refused with "the normed output must not overlap".
    ("ind-metal-overlap-adjacent", "metal-encode-checks",
     "Sources/MoEKernels/MetalBackend/MetalPass.swift",
     "offset < other.offset + otherBytes && other.offset < offset + bytes",
     "offset <= other.offset + otherBytes && other.offset <= offset + bytes",
     ("swift test --filter EncodeTests",)),

    # A layer with exactly MOE_MAX_EXPERTS (1024) experts is refused by the metal/softmetal backend although the documented limit is "at most 1024".
    ("ind-metal-max-experts-boundary", "metal-loader",
     "Sources/MoEKernels/MetalBackend/MetalBackend.swift",
     "guard c.numExperts <= Int(MOE_MAX_EXPERTS) else {",
     "guard c.numExperts < Int(MOE_MAX_EXPERTS) else {",
     ("pytest tests/python/test_bad_inputs.py tests/python/test_softmetal_backend.py",)),

    # CPU routing with a selection bias (DeepSeek-V3 / GLM e_score_correction_bias) returns the biased selection scores as routing weights instead of the unbiased scores, so outputs and route() weights are wrong.
    ("ind-route-weights-biased", "routing",
     "Sources/MoEKernels/Layer/Routing.swift",
     "            weights[j] = scores[winner]\n",
     "            weights[j] = choice[winner]\n",
     ("pytest tests/python/test_options.py",)),

    # The Metal router breaks exact ties toward the higher expert index (the CPU and spec keep the lower), so tied scores pick different experts on metal/softmetal than on the CPU.
    ("ind-msl-router-tie-order", "routing",
     "Sources/MoEKernels/Metal/moe_common.h",
     "return a > b || (a == b && ia < ib);",
     "return a > b || (a == b && ia > ib);",
     ("pytest tests/python/test_layer.py tests/python/test_metal_kernels.py",)),

    # The CPU RMSNorm drops Gemma's `offset` (1 + weight) for the tail elements past the last multiple of 16, so norms with offset != 0 and a hidden size not divisible by 16 give wrong values in those columns.
    ("ind-rmsnorm-tail-offset", "norms-activations",
     "Sources/MoEKernels/Layer/RMSNorm.swift",
     "            out[i] = v[i] * inverse * (offset + weight[i])\n",
     "            out[i] = v[i] * inverse * weight[i]\n",
     ("pytest tests/python/test_boundaries.py -k cpu",)),

    # The Metal swiglu_oai (gpt-oss) activation no longer clamps the up value from below at -limit, so up projections below -limit give different (larger-magnitude) outputs than the CPU/reference.
    ("ind-msl-swiglu-lower-clamp", "norms-activations",
     "Sources/MoEKernels/Metal/moe_common.h",
     "const float uc = max(min(u, limit), -limit);",
     "const float uc = min(u, limit);",
     ("pytest tests/python/test_metal_kernels.py tests/python/test_boundaries.py -k gpu",)),

    # The transformers experts backend no longer notices in-place weight changes (optimizer steps, copy_ into a parameter), so it keeps running the stale layer built from the old weights.
    ("ind-hf-signature-no-version", "integrations",
     "python/moe_swift/integrations/transformers.py",
     "(name, p.data_ptr(), p._version, tuple(p.shape), p.dtype)",
     "(name, p.data_ptr(), tuple(p.shape), p.dtype)",
     ("pytest tests/python/test_integrations.py",)),

    # mlx-lm's patched SwitchGLU lays the k copies of the token rows out token-major instead of per token, so with several tokens and k > 1 each (token, slot) pair is computed on another token's row.
    ("ind-mlx-rows-tile", "integrations",
     "python/moe_swift/integrations/mlx_lm.py",
     "rows = np.repeat(x_rows.reshape(-1, hidden), k, axis=0)",
     "rows = np.tile(x_rows.reshape(-1, hidden), (k, 1))",
     ("pytest tests/python/test_integration_mlx.py",)),

    # ExpertParallelLayer no longer rejects a group in which two ranks hold the same expert, so overlapping shares are accepted and those experts are added twice in the all-reduced output.
    ("ind-dist-doubled-count", "expert-parallel",
     "python/moe_swift/distributed.py",
     "doubled = np.flatnonzero(counts > 1)",
     "doubled = np.flatnonzero(counts > 2)",
     ("pytest tests/python/test_distributed.py",)),

    # An interleaved expert share (local_experts=range(r, E, N)) treats experts it does not hold as held (at the rounded-down place), so its partial output adds slots computed with another expert's weights.
    ("ind-share-place-stride", "expert-parallel",
     "Sources/MoEKernels/Layer/MoEConfiguration.swift",
     "guard d >= 0, d % stride == 0, d / stride < count else { return nil }",
     "guard d >= 0, d / stride < count else { return nil }",
     ("pytest tests/python/test_distributed.py",)),

    # float32 -> bfloat16 outputs of the C ABI / typed calls round exact ties down instead of to nearest even, so a result whose low 16 bits are exactly 0x8000 with an odd bf16 mantissa comes out one ulp low.
    ("ind-bf16-store-ties", "format-conversions",
     "Sources/MoEKernels/CABI/ActivationRows.swift",
     "(b &+ 0x7FFF &+ ((b >> 16) & 1)) >> 16",
     "(b &+ 0x7FFF) >> 16",
     ("pytest tests/python/test_layer.py -k round_half",)),

    # ggml Q3_K weights decode with the scale bit pairs taken from the wrong byte/shift (index and shift swapped), so Q3_K layers on the CPU give values that differ from ggml's dequantization.
    ("ind-ggml-q3k-scale-bits", "format-decoding",
     "Sources/CMoECPU/formats/ggml.c",
     "(s[8 + j % 4] >> (2 * (j / 4)))",
     "(s[8 + j / 4] >> (2 * (j % 4)))",
     ("pytest tests/python/test_ggml_formats.py",)),
]
