#!/usr/bin/env python3
"""Mutation testing: plausible one-line bugs planted one at a time in a scratch copy of the
repository, rebuilt, and run against both test suites. A mutant is killed when a suite
fails; a surviving mutant is a promise no test holds. Not run in CI (minutes per mutant);
run it before resolving an issue that touches the core.

    python3 scripts/mutate.py --check            # every mutant's code is where the catalogue says
    python3 scripts/mutate.py                    # run them all (about 3 minutes each)
    python3 scripts/mutate.py --only metal-combine-shared-first,router-nan-wins
    python3 scripts/mutate.py --only X --full    # the whole suites, not the mutant's own tests
    python3 scripts/mutate.py --report           # the table and the score of the last runs
    python3 scripts/mutate.py --set independent  # the independently designed set (below)

Two sets: CATALOGUE, below, written beside the tests (each new kind of survivor joins it
with the test that now kills it), and INDEPENDENT (scripts/mutants_independent.py),
designed by a reviewer who read the product code and docs but not the tests: the score on
a set the tests were not written against.

A mutant may name its own tests (a sixth field: test commands, each `pytest ARGS` against
the scratch copy's release library, or `swift test ARGS`), which run instead of the whole
suites: minutes instead of half an hour. A mutant they miss is run with --full before it
counts as a survivor.

Results go to tests/mutation_results.json (one entry per mutant, the latest run).
The scratch copy is $MOE_MUTATE_DIR (default /tmp/moe-mutate), a clone of this
checkout's HEAD, kept between runs so that builds are incremental.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "tests" / "mutation_results.json"
SCRATCH = pathlib.Path(os.environ.get("MOE_MUTATE_DIR", "/tmp/moe-mutate"))

# (id, area, file, code, mutated code[, tests]): `code` must occur exactly once in `file`;
# `tests`, the commands that should kill it (see the docstring).
CATALOGUE = [
    # routing
    ("router-nan-wins", "routing", "Sources/MoEKernels/Layer/Routing.swift",
     "b.isNaN ? !a.isNaN : a > b", "a.isNaN ? true : (b.isNaN ? true : a > b)"),
    ("router-ties-higher-index", "routing", "Sources/MoEKernels/Layer/Routing.swift",
     "b.isNaN ? !a.isNaN : a > b", "b.isNaN ? !a.isNaN : a >= b"),
    ("router-no-renormalisation", "routing", "Sources/MoEKernels/Layer/Routing.swift",
     "if normTopKProb { weights[j] /= sum + 1e-20 }", "if normTopKProb && false { weights[j] /= sum + 1e-20 }"),
    ("router-scale-ignored", "routing", "Sources/MoEKernels/Layer/Routing.swift",
     "weights[j] *= routedScalingFactor", "weights[j] *= 1"),
    ("router-per-expert-scale-ignored", "routing", "Sources/MoEKernels/Layer/Routing.swift",
     "if let perExpert = perExpertScale { weights[j] *= perExpert[Int(ids[j])] }", ""),
    ("router-group-score-one-member", "routing", "Sources/MoEKernels/Layer/Routing.swift",
     ": choice[first] + choice[best(choice, in: range, excluding: first)]", ": choice[first]"),
    # (A NaN taking the softmax max is no mutant: one NaN logit makes every softmax score
    # NaN either way. The selection order is where the NaN rule shows.)
    ("metal-router-nan-wins", "metal kernels", "Sources/MoEKernels/Metal/moe_common.h",
     "if (an || bn) return bn && (!an || ia < ib);", "if (an || bn) return an && (!bn || ia < ib);"),
    # activations
    ("silu-without-gate", "activations", "Sources/MoEKernels/CPU/Activation.swift",
     "return g / (1 + expf(-g)) * u", "return g * u"),
    ("gelu-constant", "activations", "Sources/MoEKernels/CPU/Activation.swift",
     "0.7978845608 * (g + 0.044715 * g * g * g)", "0.7978845608 * (g + 0.0447 * g * g * g)"),
    ("swiglu-oai-no-plus-one", "activations", "Sources/MoEKernels/CPU/Activation.swift",
     "return gc / (1 + expf(-alpha * gc)) * (uc + 1)", "return gc / (1 + expf(-alpha * gc)) * uc"),
    ("metal-gelu-constant", "metal kernels", "Sources/MoEKernels/Metal/moe_common.h",
     "0.7978845608f * (g + 0.044715f * g * g * g)", "0.7978845608f * (g + 0.04f * g * g * g)"),
    ("metal-swiglu-oai-no-plus-one", "metal kernels", "Sources/MoEKernels/Metal/moe_common.h",
     "return gc / (1.0f + exp(-alpha * gc)) * (uc + 1.0f);", "return gc / (1.0f + exp(-alpha * gc)) * uc;"),
    # combine
    ("combine-shared-dropped", "combine", "Sources/MoEKernels/CPU/CPUPass.swift",
     "                        if let sharedOut {\n", "                        if let sharedOut, false {\n"),
    ("combine-residual-dropped", "combine", "Sources/MoEKernels/CPU/CPUPass.swift",
     "                        if let residual {\n                            let r = residual + t * h + h0",
     "                        if let residual, false {\n                            let r = residual + t * h + h0"),
    ("combine-last-slot-dropped", "combine", "Sources/MoEKernels/CPU/CPUPass.swift",
     "for j in 1..<k {", "for j in 1..<Swift.max(1, k - 1) {"),
    ("metal-combine-residual-dropped", "metal kernels", "Sources/MoEKernels/Metal/moe_combine.metal",
     "if (p.has_residual != 0) acc += residual[i];", ""),
    ("metal-combine-shared-dropped", "metal kernels", "Sources/MoEKernels/Metal/moe_combine.metal",
     "if (p.has_shared != 0) acc += shared_out[i];", ""),
    ("combine-slots-reversed", "combine", "Sources/MoEKernels/CPU/CPUPass.swift",
     "let row = pairRow[t * k + j]", "let row = pairRow[t * k + (k - j)]"),
    ("metal-combine-shared-first", "metal kernels", "Sources/MoEKernels/Metal/moe_combine.metal",
     "    float acc = moe_held_place(pair_ids[0], p.expert_base, p.expert_stride, p.experts) != MOE_NONE ? pairs[0] : 0.0f;\n    for (uint j = 1; j < p.top_k; j++) {\n        if (moe_held_place(pair_ids[j], p.expert_base, p.expert_stride, p.experts) != MOE_NONE) acc += pairs[j * H];\n    }\n    const ulong i = (ulong)t * H + h;\n    if (p.has_shared != 0) acc += shared_out[i];\n",
     "    const ulong i = (ulong)t * H + h;\n    float acc = p.has_shared != 0 ? shared_out[i] : 0.0f;\n    for (uint j = 0; j < p.top_k; j++) {\n        if (moe_held_place(pair_ids[j], p.expert_base, p.expert_stride, p.experts) != MOE_NONE) acc += pairs[j * H];\n    }\n"),
    # formats
    ("format-bf16-shift", "formats", "Sources/CMoECPU/formats/internal.h",
     "return from_bits((uint32_t)b << 16);", "return from_bits((uint32_t)b << 15);"),
    ("format-e8m0-nan", "formats", "Sources/CMoECPU/formats/internal.h",
     "if (s == 255) return NAN;", "if (s == 254) return NAN;"),
    ("format-bit-stream-shift", "formats", "Sources/CMoECPU/formats/internal.h",
     "return (v >> (bit & 7)) & ((1u << bits) - 1u);", "return (v >> (bit & 3)) & ((1u << bits) - 1u);"),
    ("format-split-nibble-order", "formats", "Sources/CMoECPU/formats/internal.h",
     "const uint8_t byte = row[(i >> 5) * 16 + (i & 15)];", "const uint8_t byte = row[(i >> 5) * 16 + (15 - (i & 15))];"),
    ("format-q4-table-bias", "formats", "Sources/CMoECPU/formats/avx512.c",
     "table = _mm512_fmadd_ps(iota, scale, _mm512_set1_ps(p->b[g]));",
     "table = _mm512_mul_ps(iota, scale);"),
    # C ABI
    ("abi-forward-y-null-unchecked", "C ABI", "Sources/MoEKernels/CABI/Exports.swift",
     '        guard let y else { throw MoEError.invalidArgument("y is NULL") }\n        try layer.forward(',
     '        let y = y ?? UnsafeMutablePointer<Float>(bitPattern: 64)!\n        try layer.forward('),
    ("abi-struct-size-unchecked", "C ABI", "Sources/MoEKernels/CABI/LayerDescriptor.swift",
     "guard size >= minimumSize else {", "guard size >= 0 else {"),
    ("experts-ids-unchecked", "Swift API", "Sources/MoEKernels/Layer/MoELayer.swift",
     "where ids[n] < 0 || ids[n] >= e {", "where ids[n] < 0 {"),
    # Python facade
    ("py-residual-by-size", "Python facade", "python/moe_swift/layer.py",
     "if residual.shape != x.shape:", "if residual.size != x.size:"),
    ("py-shared-zero-rows", "Python facade", "python/moe_swift/layer.py",
     "            if shared_size == 0:\n", "            if shared_size < 0:\n"),
    ("n-group-divisibility", "Swift API", "Sources/MoEKernels/Layer/MoEConfiguration.swift",
     "try require(numExperts % nGroup == 0,", "try require(true,",
     ("pytest tests/python/test_bad_inputs.py -k dividing",)),
    ("py-norm-topk-prob-ignored", "Python facade", "python/moe_swift/layer.py",
     'desc.norm_topk_prob = 1 if _flag("norm_topk_prob", norm_topk_prob) else 0',
     'desc.norm_topk_prob = 1 if (_flag("norm_topk_prob", norm_topk_prob) or True) else 0'),
    ("py-bf16-as-integers", "Python facade", "python/moe_swift/arrays.py",
     'return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)',
     'return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 15).view(np.float32)'),
    # the encode API, mapped weights, the memory budget, the router's two dispatches
    ("metal-encode-bf16-truncates", "metal kernels", "Sources/MoEKernels/Metal/moe_convert.metal",
     "*out = ushort((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);", "*out = ushort(bits >> 16);"),
    ("metal-concurrent-encoder-no-final-barrier", "Metal backend", "Sources/MoEKernels/MetalBackend/MetalPass.swift",
     "if needsBarriers { encoder.memoryBarrier(scope: .buffers) }", "if false { encoder.memoryBarrier(scope: .buffers) }"),
    ("mapped-bytes-outside-memory", "checkpoint", "Sources/MoEKernels/Formats/WeightData.swift",
     "guard inner.parts.allSatisfy(memory.contains) else {", "guard true else {"),
    ("memory-budget-ignored", "Swift API", "Sources/MoEKernels/Support/MemoryBudget.swift",
     "guard let found = available(limit: limit), needed > found.bytes else { return }",
     "guard let found = available(limit: limit), needed > 2 * found.bytes else { return }"),
    # SoftMetal's own rules: lanes of one simdgroup are ordered only by a simd operation
    ("softmetal-simdgroup-always-ordered", "SoftMetal checks", "SoftMetal/Sources/SoftMetal/Runtime/memory_check.h",
     "if (thread / 32 == L->sg && sg_epoch != g->sg_epoch[L->sg]) return false;",
     "if (thread / 32 == L->sg) return false;",
     ("pytest SoftMetal/tests/python/test_softmetal_memory_check.py -k simdgroup",)),
    # blocks: the combine walks a row in blocks of 256 (killed only at H > 256)
    ("cpu-next-norm-last-block-only", "CPU backend", "Sources/MoEKernels/CPU/CPUPass.swift",
     "if next != nil { sumOfSquares += RMSNorm.sumOfSquares(acc, count: n) }",
     "if next != nil { sumOfSquares = RMSNorm.sumOfSquares(acc, count: n) }"),
    # checkpoint loader: what a file says, checked before use; defaults as transformers'
    ("ckpt-mxfp4-rows-unchecked", "checkpoint", "Sources/MoEKernels/Checkpoint/LayerReader.swift",
     "where size % 32 != 0 {", "where size % 32 != 0 && false {"),
    ("ckpt-quantized-unvalidated", "checkpoint", "Sources/MoEKernels/Checkpoint/LayerReader.swift",
     "        try data.validate(prefix + \".\" + module, shape: shape)\n", ""),
    ("ckpt-symlink-escapes", "checkpoint", "Sources/MoEKernels/Checkpoint/CheckpointFolder.swift",
     "        guard inside else {", "        guard inside || true else {"),
    ("ckpt-dotdot-shard-name", "checkpoint", "Sources/MoEKernels/Checkpoint/CheckpointFolder.swift",
     '!$0.isEmpty && $0 != ".." && $0 != "."', '!$0.isEmpty'),
    ("ckpt-not-a-regular-file", "checkpoint", "Sources/MoEKernels/Checkpoint/CheckpointFolder.swift",
     "guard (info.st_mode & S_IFMT) == S_IFREG else {", "guard (info.st_mode & S_IFMT) != 0 else {"),
    ("ckpt-header-length-quoted", "checkpoint", "Sources/MoEKernels/Checkpoint/SafeTensors.swift",
     "            throw notSafetensors\n        }\n        let end", "            throw MoEError.invalidArgument(\"\\(path): header length \\(headerLength)\")\n        }\n        let end"),
    ("ckpt-layers-from-config", "checkpoint", "Sources/MoEKernels/Checkpoint/Checkpoint.swift",
     "moeLayers = Self.blockLayers(fileOfTensor.keys, blockNames: family.blockNames)",
     "moeLayers = Array(0..<numLayers) + Self.blockLayers(fileOfTensor.keys, blockNames: family.blockNames).prefix(0)"),
    ("ckpt-deepseek-v3-scale-default", "checkpoint", "Sources/MoEKernels/Checkpoint/ModelFamilies.swift",
     "(routedScalingFactor, nGroup, topKGroup, firstDense) = (2.5, 8, 4, 3)",
     "(routedScalingFactor, nGroup, topKGroup, firstDense) = (1.0, 8, 4, 3)"),
    ("ckpt-qwen2-shared-default", "checkpoint", "Sources/MoEKernels/Checkpoint/ModelFamilies.swift",
     'default: 5632,', 'default: 0,'),
    ("layer-partial-overlap-in-place", "Swift API", "Sources/MoEKernels/Layer/MoELayer.swift",
     "        guard clash else { return try body(output) }", "        guard clash && false else { return try body(output) }"),
    ("py-quantized-mutable", "Python facade", "python/moe_swift/formats.py",
     '        if getattr(self, "_frozen", False):\n', '        if False:\n'),
    # GGUF reader's hardening: what a file says, checked before it is used
    ("gguf-tensor-past-data-end", "GGUF", "Sources/MoEKernels/Checkpoint/GGUF.swift",
     "guard info.offset <= dataBytes, info.bytes <= dataBytes - info.offset else {",
     "guard info.offset <= dataBytes else {",
     ("pytest tests/python/test_gguf.py -k 'hostile_file or truncated_anywhere'",)),
    ("gguf-dims-product-wraps", "GGUF", "Sources/MoEKernels/Checkpoint/GGUF.swift",
     "let (product, overflow) = elements.multipliedReportingOverflow(by: Int(n))",
     "let (product, overflow) = (elements &* Int(n), false)",
     ("pytest tests/python/test_gguf.py -k hostile_file",)),
    ("gguf-q6k-block-bytes", "GGUF", "Sources/MoEKernels/Checkpoint/GGUF.swift",
     '(14, "Q6_K", 256, 210)', '(14, "Q6_K", 256, 208)',
     ("pytest tests/python/test_gguf.py -k every_ggml_type",)),
    # ggml's blocks: the CPU decoders (portable and AVX2), the Metal loaders, the reference
    ("ggml-kquant-min-high-bits", "formats", "Sources/CMoECPU/formats/internal.h",
     "*m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);", "*m = (q[j + 4] >> 4) | ((q[j] >> 7) << 4);",
     ("pytest tests/python/test_ggml_formats.py -k every_type_on_the_cpu_backend",)),
    ("ggml-q6k-no-bias-portable", "formats", "Sources/CMoECPU/formats/ggml.c",
     "const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;",
     "const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));",
     ("MOE_CPU_ISA=portable pytest tests/python/test_ggml_formats.py -k every_type_on_the_cpu_backend",)),
    ("ggml-avx2-q6k-high-pair", "formats", "Sources/CMoECPU/formats/ggml_avx2_blocks.h",
     "_mm256_and_si256(_mm256_srli_epi16(h, 2), top2));", "_mm256_and_si256(_mm256_srli_epi16(h, 3), top2));",
     ("MOE_CPU_ISA=avx2 pytest tests/python/test_ggml_formats.py -k every_type_on_the_cpu_backend",)),
    ("metal-ggml-kquant-min-high-bits", "metal kernels", "Sources/MoEKernels/Metal/moe_formats.h",
     "mn = (p[sub + 4] >> 4) | ((p[sub] >> 6) << 4);", "mn = (p[sub + 4] >> 4) | ((p[sub] >> 6) << 5);",
     ("pytest tests/python/test_metal_ggml.py -k loader_matches",)),
    ("ref-ggml-kquant-min-from-scales", "reference", "python/moe_swift/ggml_blocks.py",
     "mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)", "mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 0:4] >> 6) << 4)",
     ("pytest tests/python/test_ggml_formats.py -k dequantize_is_ggmls",)),
    # SoftMetal's checks: a barrier is no order across threadgroups; struct copies are accesses
    ("softmetal-barrier-orders-threadgroups", "SoftMetal checks", "SoftMetal/Sources/SoftMetal/Runtime/memory_check.h",
     "if (group != g->id) return device && !synchronized(",
     "if (group != g->id) return device && g->epoch == 0 && !synchronized(",
     ("pytest SoftMetal/tests/python/test_softmetal_memory_check.py -k 'handoff or threadgroup_scope or coherent'",)),
    ("softmetal-memcpy-unchecked", "SoftMetal checks", "SoftMetal/Sources/SoftMetal/Compiler/CheckedIR.swift",
     '        ("@llvm.memcpy.p0.p0.i64(", "@__sm_memcpy_checked("),\n', "",
     ("pytest SoftMetal/tests/python/test_third_party_mlx.py -k struct_copy",)),
    ("softmetal-atomic-after-plain-unchecked", "SoftMetal checks", "SoftMetal/Sources/SoftMetal/Runtime/memory_check.h",
     "if (c->races && x->w_group && !(x->w_thread & SM_SHADOW_ATOMIC) &&",
     "if (c->races && x->w_group && !(x->w_thread & SM_SHADOW_ATOMIC) && atomic == ATOMIC_LOAD &&",
     ("pytest SoftMetal/tests/python/test_softmetal_rules.py -k atomic_and_a_plain_access",)),
    # mapped weights: Metal's bytesNoCopy rule, checked in the library (not only in Python)
    ("mapped-alignment-unchecked", "checkpoint", "Sources/MoEKernels/Formats/WeightMemory.swift",
     "guard Int(bitPattern: base) % Self.pageSize == 0, length > 0, length % Self.pageSize == 0 else {",
     "guard length > 0, length % Self.pageSize == 0 else {",
     ("pytest tests/python/test_abi.py -k mapped",)),
    # GGUF metadata defaults (llama.cpp's, per architecture), found by the defaults tests
    ("gguf-glm-lite-48-layers-missed", "GGUF", "Sources/MoEKernels/Checkpoint/GGUFCheckpoint.swift",
     "[47, 48].contains(numLayers)", "[47].contains(numLayers)",
     ("pytest tests/python/test_gguf_defaults.py",)),
    ("gguf-scale-zero-kept", "GGUF", "Sources/MoEKernels/Checkpoint/GGUFCheckpoint.swift",
     "let scale = try number(\"expert_weights_scale\"), scale != 0 {",
     "let scale = try number(\"expert_weights_scale\") {",
     ("pytest tests/python/test_gguf_defaults.py",)),
    ("gguf-norm-default-true", "GGUF", "Sources/MoEKernels/Checkpoint/GGUFCheckpoint.swift",
     "try flag(\"expert_weights_norm\") ?? arch.normalize :", "try flag(\"expert_weights_norm\") ?? true :",
     ("pytest tests/python/test_gguf_defaults.py",)),
    # drawn shapes: tails and clamps that hand-picked sizes miss
    ("rmsnorm-tail-without-offset", "CPU backend", "Sources/MoEKernels/Layer/RMSNorm.swift",
     "            out[i] = v[i] * inverse * (offset + weight[i])", "            out[i] = v[i] * inverse * weight[i]",
     ("pytest tests/python/test_boundaries.py -k cpu",)),
    ("swiglu-oai-up-no-lower-clamp", "activations", "Sources/MoEKernels/CPU/Activation.swift",
     "let uc = Swift.max(Swift.min(u, limit), -limit)", "let uc = Swift.min(u, limit)",
     ("pytest tests/python/test_boundaries.py -k cpu",)),
    # 8-bit activations: the grid both backends and the reference share
    ("q8-cpu-scale-over-128", "CPU backend", "Sources/CMoECPU/formats/q8.c",
     "float d = finite ? amax / 127.0f : NAN;", "float d = finite ? amax / 128.0f : NAN;",
     ("pytest tests/python/test_q8_activations.py",)),
    ("metal-q8-truncates", "metal kernels", "Sources/MoEKernels/Metal/moe_convert.metal",
     "clamp(int(rint(v / d)), -127, 127)", "clamp(int(v / d), -127, 127)",
     ("pytest tests/python/test_metal_kernels.py -k quantize_q8",)),
    # transformers: the experts' matrices moved into one buffer the layer reads in place
    ("tf-in-place-offsets-in-elements", "integrations", "python/moe_swift/integrations/transformers.py",
     "total += -(-p.numel() * p.element_size() // _ALIGNMENT) * _ALIGNMENT",
     "total += -(-p.numel() // _ALIGNMENT) * _ALIGNMENT",
     ("pytest tests/python/test_integrations.py -k held_once",)),
    # issue 46's survivors and their siblings: metadata forms, magnitudes, non-default
    # integration knobs, and kills that rested on one test
    ("gguf-per-layer-array-first-value", "GGUF", "Sources/MoEKernels/Checkpoint/GGUFCheckpoint.swift",
     "        return values[layer]\n    }", "        return values[0]\n    }",
     ("pytest tests/python/test_gguf.py -k per_layer_array",)),
    ("gguf-shared-width-first-layer", "GGUF", "Sources/MoEKernels/Checkpoint/GGUFCheckpoint.swift",
     'perLayer("expert_shared_feed_forward_length", layer: layer)', 'perLayer("expert_shared_feed_forward_length", layer: 0)',
     ("pytest tests/python/test_gguf.py -k per_layer_array",)),
    ("gguf-glm-selection-bias-optional", "GGUF", "Sources/MoEKernels/Checkpoint/GGUFCheckpoint.swift",
     "a.selectionBiasRequired = true", "a.selectionBiasRequired = false",
     ("pytest tests/python/test_gguf.py -k required_tensor_missing",)),
    ("rmsnorm-eps-outside-sqrt", "CPU backend", "Sources/MoEKernels/Layer/RMSNorm.swift",
     "1 / (sumOfSquares / Float(count) + eps).squareRoot()", "1 / ((sumOfSquares / Float(count)).squareRoot() + eps)",
     ("pytest tests/python/test_fused_norms.py -k eps_where",)),
    ("metal-input-norm-eps-outside-sqrt", "metal kernels", "Sources/MoEKernels/Metal/moe_router.metal",
     "const float inverse = 1.0f / sqrt(simd_sum(sum) / float(H) + p.input_norm_eps);",
     "const float inverse = 1.0f / (sqrt(simd_sum(sum) / float(H)) + p.input_norm_eps);",
     ("pytest tests/python/test_fused_norms.py -k eps_where",)),
    ("metal-next-norm-eps-outside-sqrt", "metal kernels", "Sources/MoEKernels/Metal/moe_combine.metal",
     "1.0f / sqrt(total / float(p.hidden) + p.next_norm_eps)", "1.0f / (sqrt(total / float(p.hidden)) + p.next_norm_eps)",
     ("pytest tests/python/test_fused_norms.py -k eps_where",)),
    ("bf16-output-rounds-half-up", "C ABI", "Sources/MoEKernels/CABI/ActivationRows.swift",
     "(b &+ 0x7FFF &+ ((b >> 16) & 1)) >> 16", "(b &+ 0x8000) >> 16",
     ("pytest tests/python/test_layer.py -k round_half_to_even",)),
    ("py-bf16-rounds-half-up", "Python facade", "python/moe_swift/arrays.py",
     "rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16)", "rounded = ((u + 0x8000) >> 16)",
     ("pytest tests/python/test_layer.py -k round_half",)),
    ("router-scale-twice-with-per-expert", "routing", "Sources/MoEKernels/Layer/Routing.swift",
     "if let perExpert = perExpertScale { weights[j] *= perExpert[Int(ids[j])] }",
     "if let perExpert = perExpertScale { weights[j] *= perExpert[Int(ids[j])] * routedScalingFactor }",
     ("pytest tests/python/test_options.py -k every_combination",)),
    ("metal-router-scale-twice-with-per-expert", "metal kernels", "Sources/MoEKernels/Metal/moe_router.metal",
     "if (p.has_per_expert_scale != 0) w *= per_expert_scale[out_ids[out + j]];",
     "if (p.has_per_expert_scale != 0) w *= per_expert_scale[out_ids[out + j]] * p.routed_scaling_factor;",
     ("pytest tests/python/test_options.py -k every_combination",)),
    ("encode-adjacent-is-overlap", "Metal backend", "Sources/MoEKernels/MetalBackend/MetalPass.swift",
     "offset < other.offset + otherBytes && other.offset < offset + bytes",
     "offset <= other.offset + otherBytes && other.offset <= offset + bytes",
     ("swift test --filter EncodeTests",)),
    ("encode-one-element-overlap-missed", "Metal backend", "Sources/MoEKernels/MetalBackend/MetalPass.swift",
     "offset < other.offset + otherBytes && other.offset < offset + bytes",
     "offset + 4 < other.offset + otherBytes && other.offset + 4 < offset + bytes",
     ("swift test --filter EncodeTests",)),
    ("q8-avx2-kquant-first-activation-scale", "CPU backend", "Sources/CMoECPU/formats/q8_avx2.c",
     "t[sub % CH][i] = add_scaled(dot, x.scales[i] + (k >> 5) + sub, t[sub % CH][i]);",
     "t[sub % CH][i] = add_scaled(dot, x.scales[i] + (k >> 5), t[sub % CH][i]);",
     ("MOE_CPU_ISA=avx2 pytest tests/python/test_q8_activations.py",)),
    ("tf-gpt-oss-alpha-dropped", "integrations", "python/moe_swift/integrations/transformers.py",
     'knobs = {"swiglu_alpha": alpha, "swiglu_limit": limit}', 'knobs = {"swiglu_alpha": 1.702, "swiglu_limit": limit}',
     ("pytest tests/python/test_transformers_families.py -k non_default_knobs",)),
    ("mlx-gpt-oss-limit-dropped", "integrations", "python/moe_swift/integrations/mlx_lm.py",
     "swiglu_alpha=glu.activation._alpha, swiglu_limit=glu.activation._limit)", "swiglu_alpha=glu.activation._alpha)",
     ("pytest tests/python/test_integration_mlx.py -k knobs",)),
    # the ends of each format's range: decoders' own branches at subnormals and E8M0's 0
    ("format-e8m0-zero-is-zero", "formats", "Sources/CMoECPU/formats/internal.h",
     "if (s == 0) return from_bits(0x00400000u);", "if (s == 0) return 0.0f;",
     ("pytest tests/python/test_boundaries.py -k 'ends_of_its_range and cpu'",)),
    ("metal-e8m0-zero-is-zero", "metal kernels", "Sources/MoEKernels/Metal/moe_formats.h",
     "if (s == 0) return as_type<float>(0x00400000u);", "if (s == 0) return 0.0f;",
     ("pytest tests/python/test_boundaries.py -k 'ends_of_its_range and softmetal'",)),
    ("format-f16-subnormal-flushed", "formats", "Sources/CMoECPU/formats/internal.h",
     "const float v = (float)mantissa * 0x1p-24f;", "const float v = 0.0f;",
     ("MOE_CPU_ISA=portable pytest tests/python/test_boundaries.py -k 'ends_of_its_range and cpu'",)),
]


def mutant_set(name):
    if name == "independent":
        sys.path.insert(0, str(ROOT / "scripts"))
        from mutants_independent import INDEPENDENT
        return INDEPENDENT
    return CATALOGUE


def check_catalogue(mutants):
    problems = []
    ids = [m[0] for m in mutants]
    if len(set(ids)) != len(ids):
        problems.append("duplicate mutant ids")
    for mid, _, path, old, new, *tests in mutants:
        for cmd in (tests[0] if tests else ()):
            try:
                parse_command(cmd)
            except ValueError as e:
                problems.append(f"{mid}: {e}")
        text = (ROOT / path).read_text()
        n = text.count(old)
        if n != 1:
            problems.append(f"{mid}: the code occurs {n} times in {path} (must be once)")
        if old == new:
            problems.append(f"{mid}: the mutation changes nothing")
    return problems


def run(cmd, cwd, env=None, timeout=1800):
    t0 = time.time()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, time.time() - t0, (p.stdout + p.stderr)[-3000:]


def prepare_scratch():
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    if not (SCRATCH / ".git").exists():
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(SCRATCH)], check=True)
    subprocess.run(["git", "fetch", "--quiet", str(ROOT), head], cwd=SCRATCH, check=True)
    subprocess.run(["git", "checkout", "--quiet", "--force", head], cwd=SCRATCH, check=True)
    native = SCRATCH / "python" / "moe_swift" / "_native"
    native.mkdir(parents=True, exist_ok=True)
    installed = ROOT / "python" / "moe_swift" / "_native"
    for so in installed.glob("*.so*"):  # the Swift runtime beside the library
        if not (native / so.name).exists():
            shutil.copy2(so, native / so.name)
    return head


def parse_command(cmd):
    """`[VAR=value ...] pytest ARGS` or `[VAR=value ...] swift test ARGS` as (variables, words)."""
    words = shlex.split(cmd)
    assigned = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        key, value = words.pop(0).split("=", 1)
        assigned[key] = value
    if words[:1] != ["pytest"] and words[:2] != ["swift", "test"]:
        raise ValueError(f"test command {cmd!r} is neither `pytest ...` nor `swift test ...`")
    return assigned, words


def build_and_test(suites, tests=()):
    """(status, details): 'killed' if a suite (or one of `tests`) fails, 'survived' if all
    pass, 'stillborn' if the mutant does not build or a command of `tests` selects no test."""
    build = ["swift", "build", "-c", "release", "--product", "MoESwift", "--scratch-path", ".build/python"]
    if sys.platform.startswith("linux"):
        build += ["-Xswiftc", "-no-toolchain-stdlib-rpath"]
    code, secs, out = run(build, SCRATCH)
    if code != 0:
        return "stillborn", f"build failed ({secs:.0f} s): {out[-500:]}"
    native = SCRATCH / "python" / "moe_swift" / "_native"
    shutil.copy2(SCRATCH / ".build" / "python" / "release" / ("libMoESwift.dylib" if sys.platform == "darwin" else "libMoESwift.so"), native)
    shutil.copy2(SCRATCH / "Sources" / "CMoESwift" / "include" / "moe_swift.h", native)
    # SoftMetal's harness tests import `softmetal` from its own folder; the Swift runtime is
    # the toolchain's where no installed copy was put beside the library. SoftMetal's disk
    # cache is the scratch copy's own: a mutant's libraries must not be served to anyone else.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCRATCH / "python"), str(SCRATCH / "SoftMetal" / "python")]),
               SOFTMETAL_CACHE_DIR=str(SCRATCH / ".smcache"))
    runtime = pathlib.Path(shutil.which("swift") or "swift").resolve().parent.parent / "lib" / "swift" / "linux"
    if sys.platform.startswith("linux") and runtime.is_dir():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [env.get("LD_LIBRARY_PATH"), str(runtime)]))
    pytest = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    if tests:
        commands = []
        for cmd in tests:
            assigned, words = parse_command(cmd)
            commands.append((cmd, pytest + words[1:] if words[0] == "pytest" else words, dict(env, **assigned)))
    else:
        commands = [(name, argv, env) for suite, name, argv in (("swift", "swift test", ["swift", "test"]),
                                                                ("python", "pytest", pytest + ["tests/python"]))
                    if suite in suites]
    killed_by = []
    for name, argv, command_env in commands:
        code, secs, out = run(argv, SCRATCH, env=command_env)
        if code == 5 and argv[:3] == pytest[:3]:  # pytest collected nothing: a command that names no test kills nothing
            return "stillborn", f"{name}: no tests collected"
        if code >= 2 and argv[:3] == pytest[:3]:
            # Interrupted, a collection error (the library failed to load), an internal or a
            # usage error: the tests did not run, so they killed nothing.
            return "stillborn", f"{name}: pytest exited with {code}, its tests did not run: {out[-300:]}"
        if code != 0:
            killed_by.append(f"{name} ({secs:.0f} s)")
    if killed_by:
        return "killed", ", ".join(killed_by)
    return "survived", "every test passed" if not tests else "its own tests passed (run --full before counting it)"


def load_results():
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def report(mutants):
    results = load_results()
    rows = [(m[0], m[1], results.get(m[0], {}).get("status", "not run"), results.get(m[0], {}).get("details", ""))
            for m in mutants]
    width = max(len(r[0]) for r in rows)
    for mid, area, status, details in rows:
        print(f"{mid:<{width}}  {area:<14}  {status:<9}  {details[:80]}")
    ran = [r for r in rows if r[2] in ("killed", "survived")]
    killed = sum(r[2] == "killed" for r in ran)
    if ran:
        print(f"\nscore: {killed}/{len(ran)} killed ({100 * killed / len(ran):.0f}%), "
              f"{len(mutants) - len(ran)} of {len(mutants)} not run or stillborn")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only check that every mutant's code is in place")
    p.add_argument("--report", action="store_true", help="print the table of the last results")
    p.add_argument("--only", help="comma-separated mutant ids")
    p.add_argument("--set", default="catalogue", choices=("catalogue", "independent"),
                   help="which mutants: the catalogue (default) or the independently designed set")
    p.add_argument("--suites", default="swift,python", help="swift,python (default both)")
    p.add_argument("--baseline", action="store_true",
                   help="run the chosen mutants' own tests on the unmutated copy (each must pass, or its kills mean nothing)")
    p.add_argument("--full", action="store_true", help="run the whole suites even for a mutant that names its tests")
    args = p.parse_args(argv)
    mutants = mutant_set(args.set)
    problems = check_catalogue(mutants)
    if problems or args.check:
        print("\n".join(problems) or f"{len(mutants)} mutants, each in place")
        return 1 if problems else 0
    if args.report:
        report(mutants)
        return 0
    chosen = [m for m in mutants if not args.only or m[0] in args.only.split(",")]
    head = prepare_scratch()
    if args.baseline:
        commands = list(dict.fromkeys(cmd for m in chosen for cmd in (m[5] if len(m) > 5 else ())))
        status, details = build_and_test((), commands)
        print(f"unmutated, {len(commands)} test commands: {'all pass' if status == 'survived' else details}")
        return 0 if status == "survived" else 1
    results = load_results()
    for mid, area, path, old, new, *tests in chosen:
        target = SCRATCH / path
        original = target.read_text()
        target.write_text(original.replace(old, new, 1))
        t0 = time.time()
        try:
            # A kernel mutant reaches the library through the build (Plugins/EmbedMSL).
            status, details = build_and_test(args.suites.split(","), () if args.full or not tests else tests[0])
        finally:
            target.write_text(original)
        results[mid] = {"status": status, "details": details, "commit": head, "seconds": round(time.time() - t0)}
        RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        print(f"{mid}: {status} ({details})", flush=True)
    report(mutants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
