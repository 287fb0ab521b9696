// A build without nvcc: every CUDA entry point reports that this build has no
// GPU support, so a request for --device cuda fails with a clear message.
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace augur::cuda {

namespace detail {
[[noreturn]] void no_cuda(const char* what) {
  fail("[cuda] ", what, ": this build of augur has no CUDA support (nvcc was not found at build time)");
}
}  // namespace detail
using detail::no_cuda;

struct Context {};
Context& context() { no_cuda("context"); }
Stream stream() { no_cuda("stream"); }
bool available() { return false; }
void synchronize() { no_cuda("synchronize"); }
uint64_t scratch_generation() { return 0; }
size_t bf16_scratch_bytes() { return 0; }
void matmul_bf16(const float*, int64_t, int64_t, int64_t, const bf16_bits*, int64_t, float*, int64_t, Stream) {
  no_cuda("matmul");
}
void matmul_half(const float*, int64_t, int64_t, int64_t, const half_bits*, Half, int64_t, float*, int64_t, Stream) {
  no_cuda("matmul");
}
int64_t stream_rows() { return 8; }
int64_t set_stream_rows(int64_t) { return 8; }
void to_bf16(const float*, int64_t, int64_t, int64_t, bf16_bits*, Stream) { no_cuda("to_bf16"); }
void to_half(const float*, int64_t, int64_t, int64_t, Half, half_bits*, Stream) { no_cuda("to_half"); }
void matmul_bf16_xb(const bf16_bits*, int64_t, int64_t, const bf16_bits*, int64_t, float*, int64_t, Stream) {
  no_cuda("matmul");
}
void embedding(const half_bits*, int64_t, const int32_t*, int64_t, float*, Stream, Half) { no_cuda("embedding"); }
void convert_half(const half_bits*, Half, half_bits*, Half, int64_t, Stream) { no_cuda("convert_half"); }
float max_abs_half(const half_bits*, Half, int64_t, Stream) { no_cuda("max_abs_half"); }
void rms_norm(const float*, const float*, float, int64_t, int64_t, float*, Stream) { no_cuda("rms_norm"); }
void add_inplace(float*, const float*, int64_t, Stream) { no_cuda("add"); }
void swiglu(const float*, const float*, float*, int64_t, Stream) { no_cuda("swiglu"); }
void rope(float*, int64_t, int64_t, int64_t, const int32_t*, const float*, int64_t, Stream) { no_cuda("rope"); }
void store_kv(const float*, const float*, int64_t, const AttnMeta&, half_bits*, half_bits*, Stream, Half) {
  no_cuda("store_kv");
}
size_t attention_workspace_bytes(int64_t, int64_t, int64_t, int64_t) { return 0; }
void paged_attention(const float*, const half_bits*, const half_bits*, int64_t, int64_t, int64_t, int64_t,
                     const AttnMeta&, float, int32_t, float*, void*, Stream, Half) {
  no_cuda("paged_attention");
}
void argmax(const float*, int64_t, int64_t, int32_t*, int32_t*, Stream) { no_cuda("argmax"); }
bool decode_attention_rope_fits(int64_t, int64_t, int64_t, const AttnMeta&, bool) { return false; }
void decode_attention_rope(const float*, const float*, const float*, float, const float*, int64_t, half_bits*,
                           half_bits*, int64_t, int64_t, int64_t, int64_t, const AttnMeta&, float, int32_t, float*,
                           void*, Stream, Half) {
  no_cuda("decode_attention_rope");
}
void add_rms_norm(float*, const float*, const float*, float, int64_t, int64_t, float*, Stream) {
  no_cuda("add_rms_norm");
}
bool norm_matmul_fits(int64_t, int64_t, int64_t) { return false; }
void norm_matmul(const float*, int64_t, int64_t, const float*, float, const half_bits*, Half, int64_t, float*, Stream) {
  no_cuda("norm_matmul");
}
bool norm_matmul_tc(const float*, int64_t, int64_t, const float*, float, const half_bits*, Half, int64_t, float*,
                    Stream) {
  no_cuda("norm_matmul_tc");
}
bool add_norm_matmul_tc(float*, const float*, const float*, float, int64_t, int64_t, const half_bits*, Half, int64_t,
                        float*, Stream) {
  no_cuda("add_norm_matmul_tc");
}
void swiglu_packed(const float*, int64_t, int64_t, float*, Stream) { no_cuda("swiglu_packed"); }
void qkv_rope_store(const float*, int64_t, int64_t, int64_t, const float*, const float*, float, const float*, int64_t,
                    const AttnMeta&, float*, half_bits*, half_bits*, Stream, Half, float*) {
  no_cuda("qkv_rope_store");
}
void apply_penalties(float*, int64_t, const PenaltyEntry*, int64_t, Stream) { no_cuda("apply_penalties"); }
void sample(const float*, int64_t, int64_t, const SampleRow*, int32_t*, int32_t*, Stream) { no_cuda("sample"); }
void slice_cols(const float*, int64_t, int64_t, int64_t, int64_t, float*, Stream) { no_cuda("slice_cols"); }
bool block_tail_fits(int64_t, int64_t, int64_t, int64_t, int64_t) { return false; }
void block_tail(const BlockTail&, Stream) { no_cuda("block_tail"); }
void swiglu_matmul(const float*, int64_t, int64_t, const half_bits*, Half, int64_t, float*, float*, Stream) {
  no_cuda("swiglu_matmul");
}
void keep_recurrent_inputs(const float*, int64_t, int64_t, int64_t, int64_t, const int32_t*, const int32_t*,
                           const RecurrentRow*, int64_t, int64_t, float*, Stream) {
  no_cuda("keep_recurrent_inputs");
}
void load_recurrent_inputs(const float*, int64_t, const int32_t*, const int32_t*, const RecurrentRow*, int64_t, int64_t,
                           float*, Stream) {
  no_cuda("load_recurrent_inputs");
}
void causal_conv1d(const float*, const float*, int64_t, int64_t, const RecurrentRow*, int64_t, int64_t, float*, bool,
                   float*, Stream) {
  no_cuda("causal_conv1d");
}
void l2norm(const float*, float, int64_t, int64_t, float*, Stream) { no_cuda("l2norm"); }
void delta_rule_gates(const float*, const float*, const float*, const float*, int64_t, int64_t, float*, float*,
                      Stream) {
  no_cuda("delta_rule_gates");
}
void gated_delta_rule_recurrent(const float*, const float*, const float*, const float*, const float*, float,
                                const DeltaRuleDims&, const RecurrentRow*, int64_t, float*, float*, Stream, const DeltaRuleFusion*) {
  no_cuda("gated_delta_rule_recurrent");
}
void gated_delta_rule_chunked(const float*, const float*, const float*, const float*, const float*, float, int64_t,
                              const DeltaRuleDims&, const RecurrentRow*, int64_t, int64_t, float*, float*, Stream) {
  no_cuda("gated_delta_rule_chunked");
}
void delta_rule_inputs(const float*, int64_t, int64_t, const float*, int64_t, const DeltaRuleDims&, const float*,
                       const float*, float, const RecurrentRow*, int64_t, int64_t, float*, float*, float*, float*,
                       float*, float*, Stream) {
  no_cuda("delta_rule_inputs");
}
void gated_rms_norm(const float*, const float*, int64_t, int64_t, const float*, float, int64_t, int64_t, float*,
                    Stream) {
  no_cuda("gated_rms_norm");
}
void sigmoid_mul(const float*, const float*, bool, int64_t, int64_t, float*, Stream) { no_cuda("sigmoid_mul"); }
void moe_route(const float*, int64_t, int64_t, int64_t, bool, float*, int32_t*, Stream) { no_cuda("moe_route"); }
size_t moe_workspace_bytes(int64_t, int64_t, int64_t, int64_t, int64_t) { return 0; }
void moe_experts(const float*, int64_t, int64_t, const half_bits*, const half_bits*, Half, int64_t, int64_t,
                 const int32_t*, const float*, int64_t, float*, void*, Stream) {
  no_cuda("moe_experts");
}

}  // namespace augur::cuda

#include "backend/cuda/memory.h"

namespace augur::cuda {

std::shared_ptr<Buffer> allocate(size_t) { no_cuda("allocate"); }
size_t free_bytes() { no_cuda("free_bytes"); }
void copy_to_device(void*, const void*, size_t) { no_cuda("copy"); }
void copy_to_host(void*, const void*, size_t) { no_cuda("copy"); }
void copy_on_device(void*, const void*, size_t) { no_cuda("copy"); }
struct HostLanding::Slot {};
HostLanding::HostLanding(size_t) : slot_(nullptr) { no_cuda("host landing"); }
HostLanding::~HostLanding() = default;
void* HostLanding::data() { no_cuda("host landing"); }
void HostLanding::mark() { no_cuda("host landing"); }
const void* HostLanding::wait() { no_cuda("host landing"); }
MemoryStats memory_stats() { return {}; }
void release_cached() {}

}  // namespace augur::cuda

namespace augur::cuda {

class Graph {};
void GraphDeleter::operator()(Graph* g) const { delete g; }
void begin_capture() { no_cuda("graph capture"); }
GraphPtr end_capture() { no_cuda("graph capture"); }
void abort_capture() noexcept {}
void launch(Graph&) { no_cuda("graph launch"); }

}  // namespace augur::cuda
