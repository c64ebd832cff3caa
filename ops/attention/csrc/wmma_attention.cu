// Flash-attention forward on tensor cores through WMMA: FP16 in, FP32 accumulate, FP16 out.
//
// A block owns one 64-row query tile of one (batch, head). Its warps form SPLIT groups of 4; each warp of a
// group owns 16 query rows, and group g takes key tiles g, g + SPLIT, g + 2·SPLIT, … (a split of the key
// range inside the block, so a small B·H·T, whose query tiles alone leave most SMs idle, still gets short
// per-block chains). Each group double-buffers its 64-key K/V tiles in padded shared memory with cp.async
// (16-byte copies, zero-filled past T). Per key tile and warp:
//   S = Q Kᵀ       4×4 WMMA 16×16×16 products into 4 fp32 accumulator fragments, kept in registers
//   softmax        on the fragments: row max and sum over a lane's elements, then across the 4 lanes that
//                  share the row (accumulator layout below); running max m and sum l in fp32, exp2 with
//                  log2(e) folded into the scale; O's fragments rescaled in registers
//   O += P V       P converted in registers from S's accumulator fragments to fp16 matrix_a fragments (the
//                  two layouts put the same (row, col) in the same lane and slot; below), 4×4 WMMA products
// At the end each warp stages its unnormalised O, m and l in shared memory and group 0 merges the SPLIT
// partial results (each weighted by exp2(m_g − m)), divides by l and writes 16-byte vectors.
//
// Accumulator layout. WMMA leaves the element-to-(row, col) map of a fragment unspecified; this kernel
// uses the one sm_80 and sm_90 have (that of two mma.m16n8k16 C tiles): with g = lane/4, t = lane%4,
// element i sits at row g + 8·((i/2)%2), column 2t + i%2 + 8·(i/4). A 16×16 fp16 matrix_a fragment holds
// the same (row, col) in its slot i mod 8 (slots 8-15, where a build has them, repeat 0-7: Volta's layout
// duplicated each element), which is what lets P go from S's fragments to PV's without shared memory.
// probe_layout() and probe_a_layout() read the real maps by loading matrices of indices into fragments; the
// extension refuses to run when either differs.
//
// q, k, v, o: [B, T, H, 64] with the last dimension contiguous (row stride H·64). Forward only.
#include <cstddef>
#include <cstdint>

#include <cuda_fp16.h>
#include <mma.h>

// WMMA_KERNEL_ONLY: the kernels without torch, for checking them with nvcc -Xptxas -v alone
#ifndef WMMA_KERNEL_ONLY
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

using namespace nvcuda;

namespace {

constexpr int D = 64;          // head dim
constexpr int BR = 64;         // query rows per block
constexpr int BC = 64;         // keys per tile
constexpr int GROUP_WARPS = 4; // warps per key group: 16 query rows each
constexpr int PAD_H = D + 8;   // fp16 row pitch: 144 bytes keeps 16-byte alignment and staggers banks
constexpr int PAD_F = D + 4;   // fp32 row pitch of the output staging
constexpr int FRAG = 8;        // elements of a 16×16 fp32 accumulator fragment per lane

static_assert(BR == BC, "the causal tile count assumes square tiles");
static_assert(BR == GROUP_WARPS * 16, "each warp of a group owns 16 query rows");

using Tile = half[BC][PAD_H];

template <int SPLIT>
struct Smem {
  half q[BR][PAD_H];
  union {
    Tile kv[SPLIT][2][2];                        // [group][buffer][K, V]
    struct {                                     // after the key loop: the partial results
      float o[SPLIT * GROUP_WARPS][16][PAD_F];
      float m[SPLIT * GROUP_WARPS][16];
      float l[SPLIT * GROUP_WARPS][16];
    } part;
  };
};

// WMMA loads and stores need 32-byte-aligned pointers: every member, and every 16-row block, starts on one
static_assert(offsetof(Smem<1>, kv) % 32 == 0 && offsetof(Smem<4>, kv) % 32 == 0 && sizeof(Tile) % 32 == 0 &&
              (16 * PAD_H * 2) % 32 == 0 && (16 * PAD_F * 4) % 32 == 0, "shared-memory layout breaks WMMA alignment");

__device__ __forceinline__ int frag_col(int lane, int i) { return 2 * (lane % 4) + i % 2 + 8 * (i / 4); }

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  int bytes = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros (rows past T)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
// a barrier for the 128 threads of one key group (ids 1…SPLIT; 0 is __syncthreads')
__device__ __forceinline__ void group_sync(int group) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(group + 1), "n"(GROUP_WARPS * 32));
}

// rows [row0, row0 + 64) of one head of a [B, T, H, 64] tensor into a padded tile, by `nthreads` threads
__device__ __forceinline__ void load_tile(half (*dst)[PAD_H], const half* base, int row0, int T, long row_stride,
                                          int tid, int nthreads) {
  for (int i = tid; i < BC * (D / 8); i += nthreads) {
    int r = i / (D / 8), c = (i % (D / 8)) * 8;
    int t = row0 + r;
    const half* src = base + static_cast<long>(t < T ? t : 0) * row_stride + c;
    cp_async16(&dst[r][c], src, t < T);
  }
}

template <bool CAUSAL, int SPLIT>
__global__ void __launch_bounds__(SPLIT * GROUP_WARPS * 32)
wmma_attention_fwd_kernel(const half* __restrict__ Q, const half* __restrict__ K, const half* __restrict__ V,
                          half* __restrict__ O, int T, int H, float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem_raw[];  // WMMA pointers need 32-byte alignment
  Smem<SPLIT>& sm = *reinterpret_cast<Smem<SPLIT>*>(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / GROUP_WARPS, wg = warp % GROUP_WARPS;   // key group; warp within it
  const int gtid = threadIdx.x % (GROUP_WARPS * 32);
  const int q0 = blockIdx.x * BR, h = blockIdx.y, b = blockIdx.z;
  const long row_stride = static_cast<long>(H) * D;
  const long head_base = static_cast<long>(b) * T * row_stride + static_cast<long>(h) * D;
  const half* k_base = K + head_base;
  const half* v_base = V + head_base;

  int n_tiles = (T + BC - 1) / BC;
  if (CAUSAL) n_tiles = min(n_tiles, static_cast<int>(blockIdx.x) + 1);  // BR == BC: the diagonal tile is the last
  const int my_tiles = n_tiles > group ? (n_tiles - group + SPLIT - 1) / SPLIT : 0;

  load_tile(sm.q, Q + head_base, q0, T, row_stride, threadIdx.x, blockDim.x);
  if (my_tiles > 0) {
    load_tile(sm.kv[group][0][0], k_base, group * BC, T, row_stride, gtid, GROUP_WARPS * 32);
    load_tile(sm.kv[group][0][1], v_base, group * BC, T, row_stride, gtid, GROUP_WARPS * 32);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> qf[D / 16];
  for (int k = 0; k < D / 16; ++k) wmma::load_matrix_sync(qf[k], &sm.q[wg * 16][k * 16], PAD_H);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> of[D / 16];
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(of[n], 0.f);

  // this lane's two rows (slot 0: row lane/4, slot 1: lane/4 + 8) and their running max and sum
  const int row_lo = q0 + wg * 16 + lane / 4;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  for (int it = 0; it < my_tiles; ++it) {
    const int tile = group + it * SPLIT, buf = it % 2;
    if (it + 1 < my_tiles) {  // the group's next tile streams in while this one is used
      load_tile(sm.kv[group][buf ^ 1][0], k_base, (tile + SPLIT) * BC, T, row_stride, gtid, GROUP_WARPS * 32);
      load_tile(sm.kv[group][buf ^ 1][1], v_base, (tile + SPLIT) * BC, T, row_stride, gtid, GROUP_WARPS * 32);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    group_sync(group);
    const Tile& kt = sm.kv[group][buf][0];
    const Tile& vt = sm.kv[group][buf][1];

    // S = Q Kᵀ: Kᵀ as a column-major matrix_b is K's rows as stored
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf[BC / 16];
    for (int n = 0; n < BC / 16; ++n) {
      wmma::fill_fragment(sf[n], 0.f);
      for (int k = 0; k < D / 16; ++k) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> kf;
        wmma::load_matrix_sync(kf, &kt[n * 16][k * 16], PAD_H);
        wmma::mma_sync(sf[n], qf[k], kf, sf[n]);
      }
    }

    // online softmax on the fragments; only the tile holding T's end or the diagonal needs a mask
    const int key0 = tile * BC;
    const bool masked = key0 + BC > T || (CAUSAL && key0 + BC - 1 > q0);
    float mx[2] = {-INFINITY, -INFINITY};
    for (int n = 0; n < BC / 16; ++n)
      for (int i = 0; i < FRAG; ++i) {
        float s = sf[n].x[i] * scale_log2;
        if (masked) {
          const int j = key0 + n * 16 + frag_col(lane, i), qi = row_lo + 8 * ((i / 2) % 2);
          if (j >= T || (CAUSAL && j > qi)) s = -INFINITY;
        }
        sf[n].x[i] = s;
        mx[(i / 2) % 2] = fmaxf(mx[(i / 2) % 2], s);
      }
    float corr[2];
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);
      // a row with nothing kept yet (m_new = −inf) must give p = 0 and a rescale of 1, not NaN
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      corr[r] = exp2f(m_run[r] - m_use);
      m_run[r] = m_new;
      mx[r] = m_use;
    }
    float sum[2] = {0.f, 0.f};
    for (int n = 0; n < BC / 16; ++n)
      for (int i = 0; i < FRAG; ++i) {
        const int r = (i / 2) % 2;
        sf[n].x[i] = exp2f(sf[n].x[i] - mx[r]);
        sum[r] += sf[n].x[i];
      }
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      l_run[r] = l_run[r] * corr[r] + sum[r];
    }
    for (int n = 0; n < D / 16; ++n)
      for (int i = 0; i < FRAG; ++i) of[n].x[i] *= corr[(i / 2) % 2];

    // O += P V, P's 16-key block k straight from S's fragment k
    for (int k = 0; k < BC / 16; ++k) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> pf;
      for (int e = 0; e < pf.num_elements; ++e) pf.x[e] = __float2half(sf[k].x[e % FRAG]);
      for (int n = 0; n < D / 16; ++n) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> vf;
        wmma::load_matrix_sync(vf, &vt[k * 16][n * 16], PAD_H);
        wmma::mma_sync(of[n], pf, vf, of[n]);
      }
    }
    group_sync(group);  // the group is done with this buffer before the refill
  }

  // the partial results of every group, staged where the K/V tiles were
  __syncthreads();
  for (int n = 0; n < D / 16; ++n)
    wmma::store_matrix_sync(&sm.part.o[warp][0][n * 16], of[n], PAD_F, wmma::mem_row_major);
  if (lane % 4 == 0)
    for (int r = 0; r < 2; ++r) {
      sm.part.m[warp][lane / 4 + 8 * r] = m_run[r];
      sm.part.l[warp][lane / 4 + 8 * r] = l_run[r];
    }
  __syncthreads();
  if (group != 0) return;

  // group 0 merges: row r of this warp, 32 columns per lane
  const int r = lane / 2, c0 = (lane % 2) * 32;
  float m = -INFINITY;
  for (int g = 0; g < SPLIT; ++g) m = fmaxf(m, sm.part.m[g * GROUP_WARPS + wg][r]);
  float w[SPLIT], l = 0.f;
  for (int g = 0; g < SPLIT; ++g) {
    const int src = g * GROUP_WARPS + wg;
    w[g] = sm.part.m[src][r] == -INFINITY ? 0.f : exp2f(sm.part.m[src][r] - m);  // a group with no keys: 0
    l += w[g] * sm.part.l[src][r];
  }
  const float inv_l = l > 0.f ? 1.f / l : 0.f;
  const int qi = q0 + wg * 16 + r;
  if (qi >= T) return;
  half* dst = O + head_base + static_cast<long>(qi) * row_stride + c0;
  for (int c = 0; c < 32; c += 8) {
    __align__(16) half vals[8];
    for (int e = 0; e < 8; ++e) {
      float acc = 0.f;
      for (int g = 0; g < SPLIT; ++g) acc += w[g] * sm.part.o[g * GROUP_WARPS + wg][r][c0 + c + e];
      vals[e] = __float2half(acc * inv_l);
    }
    *reinterpret_cast<uint4*>(dst + c) = *reinterpret_cast<const uint4*>(vals);
  }
}

// One warp: out[lane][i] = the flat index (row·16 + col) of accumulator element i in `lane`.
__global__ void probe_layout_kernel(int* out) {
  __shared__ __align__(32) float idx[16 * 16];
  for (int i = threadIdx.x; i < 256; i += 32) idx[i] = static_cast<float>(i);
  __syncwarp();
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  wmma::load_matrix_sync(f, idx, 16, wmma::mem_row_major);
  for (int i = 0; i < f.num_elements; ++i) out[threadIdx.x * FRAG + i] = static_cast<int>(f.x[i]);
  if (threadIdx.x == 0) out[32 * FRAG] = f.num_elements;
}

// One warp: out[lane][e] = the flat index (row·16 + col) of fp16 matrix_a element e in `lane` (-1 past the
// fragment's elements); out[32·16] = its element count.
__global__ void probe_a_layout_kernel(int* out) {
  __shared__ __align__(32) half idx[16 * 16];
  for (int i = threadIdx.x; i < 256; i += 32) idx[i] = __int2half_rn(i);   // 0-255: exact in fp16
  __syncwarp();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> f;
  wmma::load_matrix_sync(f, idx, 16);
  for (int e = 0; e < 16; ++e) out[threadIdx.x * 16 + e] = e < f.num_elements ? __half2int_rn(f.x[e]) : -1;
  if (threadIdx.x == 0) out[32 * 16] = f.num_elements;
}

#define FOR_EACH_VARIANT(X) X(true, 1) X(true, 2) X(true, 4) X(false, 1) X(false, 2) X(false, 4)

#ifdef WMMA_KERNEL_ONLY
#define INSTANTIATE(C, S) \
  template __global__ void wmma_attention_fwd_kernel<C, S>(const half*, const half*, const half*, half*, int, int, float);
FOR_EACH_VARIANT(INSTANTIATE)
}  // namespace
#else
using KernelPtr = void (*)(const half*, const half*, const half*, half*, int, int, float);

struct Variant {
  KernelPtr kernel;
  int threads;
  int smem;
};

Variant variant(bool causal, int split) {
#define PICK(C, S) \
  if (causal == C && split == S)                                                                         \
    return {wmma_attention_fwd_kernel<C, S>, S * GROUP_WARPS * 32, static_cast<int>(sizeof(Smem<S>))};
  FOR_EACH_VARIANT(PICK)
#undef PICK
  TORCH_CHECK(false, "wmma attention: split must be 1, 2 or 4, got ", split);
  return {};
}

}  // namespace

// o: the output, allocated by the caller (tests poison it first, so an unwritten row shows)
torch::Tensor forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor o, bool causal, double scale,
                      int64_t split) {
  for (const auto* x : {&q, &k, &v, &o}) {
    TORCH_CHECK(x->is_cuda() && x->scalar_type() == at::kHalf, "wmma attention: q, k, v, o must be fp16 CUDA tensors");
    TORCH_CHECK(x->device() == q.device(), "wmma attention: q, k, v, o must be on one device");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(x->data_ptr()) % 16 == 0,
                "wmma attention: q, k, v, o must start 16-byte aligned (cp.async and the vector stores)");
    TORCH_CHECK(x->dim() == 4 && x->size(3) == D, "wmma attention: expected [B, T, H, 64], got ", x->sizes());
    TORCH_CHECK(x->is_contiguous(), "wmma attention: q, k, v, o must be contiguous [B, T, H, 64]");
  }
  TORCH_CHECK(q.sizes() == k.sizes() && q.sizes() == v.sizes() && q.sizes() == o.sizes(),
              "wmma attention: q, k, v, o shapes differ");
  const c10::cuda::CUDAGuard guard(q.device());
  TORCH_CHECK(q.size(0) <= 65535 && q.size(2) <= 65535, "wmma attention: B and H must be at most 65535 (grid)");
  if (q.numel() == 0) return o;
  const Variant var = variant(causal, static_cast<int>(split));
  const int B = q.size(0), T = q.size(1), H = q.size(2);
  // per launch: the limit is per device, and the call is not a stream operation (allowed in graph capture)
  C10_CUDA_CHECK(cudaFuncSetAttribute(var.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, var.smem));
  var.kernel<<<dim3((T + BR - 1) / BR, H, B), var.threads, var.smem, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const half*>(q.data_ptr<at::Half>()), reinterpret_cast<const half*>(k.data_ptr<at::Half>()),
      reinterpret_cast<const half*>(v.data_ptr<at::Half>()), reinterpret_cast<half*>(o.data_ptr<at::Half>()), T, H,
      static_cast<float>(scale * 1.4426950408889634));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return o;
}

// registers per thread, spilled (local) bytes, static and dynamic shared memory, resident blocks per SM, threads
std::vector<int64_t> kernel_info(bool causal, int64_t split) {
  const Variant var = variant(causal, static_cast<int>(split));
  cudaFuncAttributes attr;
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, var.kernel));
  C10_CUDA_CHECK(cudaFuncSetAttribute(var.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, var.smem));
  int blocks = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, var.kernel, var.threads, var.smem));
  return {attr.numRegs, static_cast<int64_t>(attr.localSizeBytes), static_cast<int64_t>(attr.sharedSizeBytes),
          var.smem, blocks, var.threads};
}

// [32, 8] flat indices (row·16 + col) of each lane's accumulator elements, as this build's WMMA lays them out
torch::Tensor probe_layout() {
  auto out = torch::full({32 * FRAG + 1}, -1, torch::dtype(torch::kInt32).device(torch::kCUDA));
  probe_layout_kernel<<<1, 32, 0, c10::cuda::getCurrentCUDAStream()>>>(out.data_ptr<int>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  auto cpu = out.cpu();
  TORCH_CHECK(cpu[32 * FRAG].item<int>() == FRAG, "wmma attention: a 16×16 fp32 fragment holds ",
              cpu[32 * FRAG].item<int>(), " elements per lane, not ", FRAG);
  return cpu.narrow(0, 0, 32 * FRAG).view({32, FRAG});
}

// [32, 16] flat indices (row·16 + col) of each lane's fp16 matrix_a elements (-1: the fragment has fewer)
torch::Tensor probe_a_layout() {
  auto out = torch::full({32 * 16 + 1}, -2, torch::dtype(torch::kInt32).device(torch::kCUDA));
  probe_a_layout_kernel<<<1, 32, 0, c10::cuda::getCurrentCUDAStream()>>>(out.data_ptr<int>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  auto cpu = out.cpu();
  TORCH_CHECK(cpu[32 * 16].item<int>() <= 16, "wmma attention: a 16×16 fp16 matrix_a fragment holds ",
              cpu[32 * 16].item<int>(), " elements per lane, more than 16");
  return cpu.narrow(0, 0, 32 * 16).view({32, 16});
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "WMMA flash-attention forward: q, k, v [B, T, H, 64] fp16 into o (same shape)");
  m.def("kernel_info", &kernel_info, "[registers, local bytes, static smem, dynamic smem, blocks per SM, threads]");
  m.def("probe_layout", &probe_layout, "[32, 8] flat (row·16 + col) index of each lane's accumulator element");
  m.def("probe_a_layout", &probe_a_layout, "[32, 16] flat index of each lane's fp16 matrix_a element (-1: none)");
}
#endif  // WMMA_KERNEL_ONLY
