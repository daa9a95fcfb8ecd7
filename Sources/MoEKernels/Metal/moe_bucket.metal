// moe_bucket.metal - the (token, slot) pairs grouped by expert, once per layer, for both
// expert GEMMs (llama.cpp rebuilds its map for each matmul). Outputs:
//   expert_offsets[E + 1]  bucket e is rows [expert_offsets[e], expert_offsets[e + 1]): the
//                          pairs of the e-th expert held (moe_held_place; E: their count)
//   rows[P]                the pair (t * k + j) of each bucket row; stable: pairs of one
//                          expert keep their order, so the result never depends on timing
//   tiles[]                (expert, first row) of every MOE_GEMM_BM-row tile of every bucket
//   dispatch_args[8]       MTLDispatchThreadgroupsIndirectArguments of the gate/up GEMM
//                          (uints 0-2: tiles, I column tiles, 1) and of the down GEMM
//                          (uints 4-6: tiles, H column tiles, 1): the GEMM grids have
//                          exactly one threadgroup per tile, never an empty one.
// One threadgroup of MOE_BUCKET_THREADS threads; threadgroup(0) holds 6 * E uints.
#include "moe_kernel_params.h"
#include "moe_common.h"

kernel void moe_bucket(constant moe_bucket_params& p [[buffer(MOE_BUCKET_BUF_PARAMS)]],
                       device const int* ids [[buffer(MOE_BUCKET_BUF_IDS)]],   // (P)
                       device uint* expert_offsets [[buffer(MOE_BUCKET_BUF_OFFSETS)]],   // (E + 1)
                       device uint* rows [[buffer(MOE_BUCKET_BUF_ROWS)]],   // (P)
                       device uint2* tiles [[buffer(MOE_BUCKET_BUF_TILES)]],   // (ceil(P / BM) + E)
                       device uint* dispatch_args [[buffer(MOE_BUCKET_BUF_DISPATCH_ARGS)]],   // (8)
                       threadgroup uint* tg [[threadgroup(0)]],
                       uint tid [[thread_index_in_threadgroup]],
                       uint sg [[simdgroup_index_in_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]])
{
    const uint E = p.experts, P = p.pairs;
    threadgroup atomic_uint* counts = (threadgroup atomic_uint*)tg;   // [E]
    threadgroup uint* cursor = tg + E;                                // [E]
    threadgroup ushort* sg_count = (threadgroup ushort*)(tg + 2 * E); // [SIMDGROUPS][E]
    // (No arithmetic in threadgroup array sizes: SoftMetal's translator takes a `*` there
    // for a pointer declaration and silently makes the array thread-private.)
    threadgroup uint row_totals[MOE_BUCKET_SIMDGROUPS];
    threadgroup uint tile_totals[MOE_BUCKET_SIMDGROUPS];

    for (uint e = tid; e < E; e += MOE_BUCKET_THREADS) atomic_store_explicit(&counts[e], 0u, memory_order_relaxed);
    for (uint i = tid; i < MOE_BUCKET_SIMDGROUPS * E; i += MOE_BUCKET_THREADS) sg_count[i] = 0;
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // 1. Counts per expert (a sum: the same in any order).
    for (uint q = tid; q < P; q += MOE_BUCKET_THREADS) {
        const uint e = moe_held_place(ids[q], p.expert_base, p.expert_stride, E);
        if (e < E) atomic_fetch_add_explicit(&counts[e], 1u, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // 2. Exclusive scans of the counts (row offsets) and of the tiles per expert; each
    //    thread takes a run of consecutive experts.
    const uint per = (E + MOE_BUCKET_THREADS - 1) / MOE_BUCKET_THREADS;
    const uint e0 = min(E, tid * per), e1 = min(E, e0 + per);
    uint my_rows = 0, my_tiles = 0;
    for (uint e = e0; e < e1; e++) {
        const uint c = atomic_load_explicit(&counts[e], memory_order_relaxed);
        my_rows += c;
        my_tiles += (c + MOE_GEMM_BM - 1) / MOE_GEMM_BM;
    }
    const uint rows_before_sg = simd_prefix_exclusive_sum(my_rows);
    const uint tiles_before_sg = simd_prefix_exclusive_sum(my_tiles);
    const uint rows_sg = simd_sum(my_rows), tiles_sg = simd_sum(my_tiles);
    if (lane == 0) {
        row_totals[sg] = rows_sg;
        tile_totals[sg] = tiles_sg;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint row = rows_before_sg, tile = tiles_before_sg, all_tiles = 0, all_rows = 0;
    for (uint s = 0; s < MOE_BUCKET_SIMDGROUPS; s++) {
        if (s < sg) {
            row += row_totals[s];
            tile += tile_totals[s];
        }
        all_tiles += tile_totals[s];
        all_rows += row_totals[s];
    }
    for (uint e = e0; e < e1; e++) {
        const uint c = atomic_load_explicit(&counts[e], memory_order_relaxed);
        expert_offsets[e] = row;
        cursor[e] = row;
        for (uint r = 0; r < c; r += MOE_GEMM_BM) tiles[tile++] = uint2(e, row + r);
        row += c;
    }
    if (tid == 0) {
        // The rows placed: P less the pairs of experts not held (skipped), so
        // that the last expert's tiles end at its own rows.
        expert_offsets[E] = all_rows;
        dispatch_args[0] = all_tiles;
        dispatch_args[1] = p.gate_up_column_tiles;
        dispatch_args[2] = 1;
        dispatch_args[3] = 0;
        dispatch_args[4] = all_tiles;
        dispatch_args[5] = p.down_column_tiles;
        dispatch_args[6] = 1;
        dispatch_args[7] = 0;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // 3. Stable placement, MOE_BUCKET_THREADS pairs at a time: a pair's row is its
    //    expert's cursor + the pairs of that expert in earlier simdgroups of this batch
    //    + those in earlier lanes of its own simdgroup.
    for (uint base = 0; base < P; base += MOE_BUCKET_THREADS) {
        const uint q = base + tid;
        const uint e = q < P ? moe_held_place(ids[q], p.expert_base, p.expert_stride, E) : MOE_NONE;
        const bool valid = e < E;
        uint before_lane = 0, in_sg = 0;
        for (ushort l = 0; l < MOE_SIMD_WIDTH; l++) {
            const uint other = simd_shuffle(e, l);
            if (other == e) {
                in_sg++;
                if (l < lane) before_lane++;
            }
        }
        const bool last_in_sg = valid && before_lane + 1 == in_sg;
        if (last_in_sg) sg_count[sg * E + e] = ushort(in_sg);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        uint next_cursor = MOE_NONE;
        if (valid) {
            uint before_sg = 0, after_sg = 0;
            for (uint s = 0; s < MOE_BUCKET_SIMDGROUPS; s++) {
                const uint c = sg_count[s * E + e];
                if (s < sg) before_sg += c;
                if (s > sg) after_sg += c;
            }
            rows[cursor[e] + before_sg + before_lane] = q;
            // The batch's last pair of this expert moves the cursor on.
            if (last_in_sg && after_sg == 0) next_cursor = cursor[e] + before_sg + in_sg;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (next_cursor != MOE_NONE) cursor[e] = next_cursor;
        if (last_in_sg) sg_count[sg * E + e] = 0;
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
}
