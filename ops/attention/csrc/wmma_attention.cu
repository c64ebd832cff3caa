// Flash-attention forward on tensor cores through WMMA (issue [J]): FP16 in, FP32 accumulate, FP16 out.
//
// One block of 4 warps per (64-row query tile, head, batch); each warp owns 16 query rows. K/V tiles of
// 64 keys are double-buffered in padded shared memory with cp.async (16-byte copies, zero-filled past
// T), so the next tile streams in while this one is multiplied. Per key tile and warp:
//   S = Q Kᵀ       4×4 WMMA 16×16×16 products, fp32, stored to shared memory (the accumulator's element
//                  layout is opaque, and the softmax needs whole rows)
//   softmax        two lanes per row, 32 columns each: running max m and sum l in fp32, P = exp2(S·c − m)
//                  written as fp16; the per-row rescale exp2(m_old − m_new) as a 16×16 row-broadcast
//                  matrix, loaded as an accumulator fragment so O's fragments scale elementwise without
//                  relying on any fragment layout
//   O += P V       4×4 WMMA products into O's 4 accumulator fragments (registers)
// The end divides by l the same way, stages O through shared memory and writes 16-byte vectors.
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
constexpr int WARPS = 4;
constexpr int PAD_H = D + 8;   // fp16 row pitch: 144 bytes keeps 16-byte alignment and staggers banks
constexpr int PAD_F = BC + 4;  // fp32 row pitch of the score / output staging

static_assert(BR == BC, "the causal tile count and load_tile's bound assume square tiles");

struct Smem {
  half q[BR][PAD_H];
  half k[2][BC][PAD_H];
  half v[2][BC][PAD_H];
  float s[WARPS][16][PAD_F];   // scores, then the output staging
  half p[WARPS][16][PAD_H];
  float c[WARPS][16][16];      // row-broadcast factors
};

// WMMA loads and stores need 32-byte-aligned pointers: every member, and every row block used, starts on one
static_assert(offsetof(Smem, k) % 32 == 0 && offsetof(Smem, v) % 32 == 0 && offsetof(Smem, s) % 32 == 0 &&
              offsetof(Smem, p) % 32 == 0 && offsetof(Smem, c) % 32 == 0 && (16 * PAD_H * 2) % 32 == 0 &&
              (16 * PAD_F * 4) % 32 == 0, "shared-memory layout breaks WMMA alignment");

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  int bytes = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros (rows past T)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// rows [row0, row0 + 64) of one head of a [B, T, H, 64] tensor into a padded tile: 512 16-byte chunks, 4 per thread
__device__ __forceinline__ void load_tile(half (*dst)[PAD_H], const half* base, int row0, int T, long row_stride) {
  for (int i = threadIdx.x; i < BR * (D / 8); i += WARPS * 32) {
    int r = i / (D / 8), c = (i % (D / 8)) * 8;
    int t = row0 + r;
    const half* src = base + static_cast<long>(t < T ? t : 0) * row_stride + c;
    cp_async16(&dst[r][c], src, t < T);
  }
}

template <bool CAUSAL>
__global__ void __launch_bounds__(WARPS * 32)
wmma_attention_fwd_kernel(const half* __restrict__ Q, const half* __restrict__ K, const half* __restrict__ V,
                          half* __restrict__ O, int T, int H, float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem_raw[];  // WMMA pointers need 32-byte alignment
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = blockIdx.x * BR, h = blockIdx.y, b = blockIdx.z;
  const long row_stride = static_cast<long>(H) * D;
  const long head_base = static_cast<long>(b) * T * row_stride + static_cast<long>(h) * D;
  const half* q_base = Q + head_base;
  const half* k_base = K + head_base;
  const half* v_base = V + head_base;

  int n_tiles = (T + BC - 1) / BC;
  if (CAUSAL) n_tiles = min(n_tiles, static_cast<int>(blockIdx.x) + 1);  // BR == BC: the diagonal tile is the last

  load_tile(sm.q, q_base, q0, T, row_stride);
  load_tile(sm.k[0], k_base, 0, T, row_stride);
  load_tile(sm.v[0], v_base, 0, T, row_stride);
  cp_async_commit();

  // each row is handled by lanes 2r and 2r+1, 32 columns each
  const int r = lane / 2, half_col = (lane % 2) * 32;
  const int qi = q0 + warp * 16 + r;  // this lane's query row
  float m_run = -INFINITY, l_run = 0.f;

  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> qf[D / 16];
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> of[D / 16];
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(of[n], 0.f);

  for (int t = 0; t < n_tiles; ++t) {
    const int buf = t % 2;
    if (t + 1 < n_tiles) {  // the next tile streams in while this one is used
      load_tile(sm.k[buf ^ 1], k_base, (t + 1) * BC, T, row_stride);
      load_tile(sm.v[buf ^ 1], v_base, (t + 1) * BC, T, row_stride);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (t == 0)
      for (int k = 0; k < D / 16; ++k) wmma::load_matrix_sync(qf[k], &sm.q[warp * 16][k * 16], PAD_H);

    // S = Q Kᵀ: Kᵀ as a column-major matrix_b is K's rows as stored
    for (int n = 0; n < BC / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf;
      wmma::fill_fragment(sf, 0.f);
      for (int k = 0; k < D / 16; ++k) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> kf;
        wmma::load_matrix_sync(kf, &sm.k[buf][n * 16][k * 16], PAD_H);
        wmma::mma_sync(sf, qf[k], kf, sf);
      }
      wmma::store_matrix_sync(&sm.s[warp][0][n * 16], sf, PAD_F, wmma::mem_row_major);
    }
    __syncwarp();

    // online softmax over this tile's 64 columns of row r
    float sv[32];
    float mx = -INFINITY;
    for (int c = 0; c < 32; ++c) {
      const int j = t * BC + half_col + c;
      const bool keep = j < T && (!CAUSAL || j <= qi);
      sv[c] = keep ? sm.s[warp][r][half_col + c] * scale_log2 : -INFINITY;
      mx = fmaxf(mx, sv[c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m_run, mx);
    // a row with nothing kept yet (m_new = −inf) must give p = 0 and a rescale of 1, not NaN
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    const float corr = exp2f(m_run - m_use);
    float sum = 0.f;
    for (int c = 0; c < 32; ++c) {
      const float p = exp2f(sv[c] - m_use);
      sum += p;
      sm.p[warp][r][half_col + c] = __float2half(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l_run = l_run * corr + sum;
    m_run = m_new;
    for (int c = 0; c < 8; ++c) sm.c[warp][r][(lane % 2) * 8 + c] = corr;
    __syncwarp();

    // O = O ⊙ corr + P V
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> cf;
    wmma::load_matrix_sync(cf, &sm.c[warp][0][0], 16, wmma::mem_row_major);
    for (int n = 0; n < D / 16; ++n)
      for (int i = 0; i < cf.num_elements; ++i) of[n].x[i] *= cf.x[i];
    for (int k = 0; k < BC / 16; ++k) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> pf;
      wmma::load_matrix_sync(pf, &sm.p[warp][0][k * 16], PAD_H);
      for (int n = 0; n < D / 16; ++n) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> vf;
        wmma::load_matrix_sync(vf, &sm.v[buf][k * 16][n * 16], PAD_H);
        wmma::mma_sync(of[n], pf, vf, of[n]);
      }
    }
    __syncthreads();  // every warp is done with this buffer before the next iteration refills it
  }

  // O / l, staged through shared memory, written as 16-byte vectors
  const float inv_l = l_run > 0.f ? 1.f / l_run : 0.f;
  for (int c = 0; c < 8; ++c) sm.c[warp][r][(lane % 2) * 8 + c] = inv_l;
  __syncwarp();
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> cf;
  wmma::load_matrix_sync(cf, &sm.c[warp][0][0], 16, wmma::mem_row_major);
  for (int n = 0; n < D / 16; ++n) {
    for (int i = 0; i < cf.num_elements; ++i) of[n].x[i] *= cf.x[i];
    wmma::store_matrix_sync(&sm.s[warp][0][n * 16], of[n], PAD_F, wmma::mem_row_major);
  }
  __syncwarp();
  if (qi < T) {
    half* dst = O + head_base + static_cast<long>(qi) * row_stride + half_col;
    for (int c = 0; c < 32; c += 8) {
      __align__(16) half vals[8];
      for (int e = 0; e < 8; ++e) vals[e] = __float2half(sm.s[warp][r][half_col + c + e]);
      *reinterpret_cast<uint4*>(dst + c) = *reinterpret_cast<const uint4*>(vals);
    }
  }
}

#ifdef WMMA_KERNEL_ONLY
template __global__ void wmma_attention_fwd_kernel<true>(const half*, const half*, const half*, half*, int, int, float);
template __global__ void wmma_attention_fwd_kernel<false>(const half*, const half*, const half*, half*, int, int, float);
}  // namespace
#else
template <bool CAUSAL>
void launch(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& o, double scale) {
  const int B = q.size(0), T = q.size(1), H = q.size(2);
  const dim3 grid((T + BR - 1) / BR, H, B);
  const size_t smem = sizeof(Smem);
  auto kernel = wmma_attention_fwd_kernel<CAUSAL>;
  // per launch: the limit is per device, and the call is not a stream operation (allowed in graph capture)
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, WARPS * 32, smem, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const half*>(q.data_ptr<at::Half>()), reinterpret_cast<const half*>(k.data_ptr<at::Half>()),
      reinterpret_cast<const half*>(v.data_ptr<at::Half>()), reinterpret_cast<half*>(o.data_ptr<at::Half>()), T, H,
      static_cast<float>(scale * 1.4426950408889634));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

// o: the output, allocated by the caller (tests poison it first, so an unwritten row shows)
torch::Tensor forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor o, bool causal, double scale) {
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
  if (q.numel() > 0) {
    if (causal) launch<true>(q, k, v, o, scale);
    else launch<false>(q, k, v, o, scale);
  }
  return o;
}

// registers per thread, spilled (local) bytes, static and dynamic shared memory, and resident blocks per SM
std::vector<int64_t> kernel_info(bool causal) {
  cudaFuncAttributes attr;
  auto kernel = causal ? wmma_attention_fwd_kernel<true> : wmma_attention_fwd_kernel<false>;
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const int smem = static_cast<int>(sizeof(Smem));
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int blocks = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, WARPS * 32, smem));
  return {attr.numRegs, static_cast<int64_t>(attr.localSizeBytes), static_cast<int64_t>(attr.sharedSizeBytes), smem,
          blocks};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "WMMA flash-attention forward: q, k, v [B, T, H, 64] fp16 into o (same shape)");
  m.def("kernel_info", &kernel_info, "[registers, local bytes, static smem, dynamic smem, blocks per SM]");
}
#endif  // WMMA_KERNEL_ONLY
