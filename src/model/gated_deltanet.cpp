#include "model/gated_deltanet.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace augur {

namespace {

// Elements [begin, begin + n) of a contiguous 1-D tensor, shaped.
Tensor part(const Tensor& flat, int64_t begin, std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return flat.slice_rows(begin, begin + n).reshape(shape);
}

}  // namespace

Tensor gated_deltanet_mix(const Tensor& x, const GatedDeltaNetWeights& w, const GatedDeltaNetShape& s,
                          std::span<const ops::RecurrentRow> rows, const ops::RecurrentLayer& state, Scratch& scratch,
                          const ops::DeviceBatch* device, const Tensor& projected) {
  const int64_t T = x.dim(0), H = s.n_head, Hk = s.n_head_k, dk = s.head_dim_k, dv = s.head_dim_v;
  const int64_t C = s.conv_dim(), V = s.value_dim();
  Tensor mixed, z, b, a;  // [T, C] (q, k, v before the conv), [T * H, dv], [T, H], [T, H]
  Tensor conv = scratch.get("gdn.conv", {T, C});
  Tensor q, k, v;         // [T, Hk, dk], [T, Hk, dk], [T, H, dv]
  if (T == 1 && w.in_all.defined()) {
    // One token (a decode step): the four projections as one matmul, and q,
    // k, v read in place from the conv output, where they lie back to back.
    Tensor proj = projected.defined() ? projected.reshape({C + V + 2 * H})
                                      : scratch.get("gdn.proj", {1, C + V + 2 * H}).reshape({C + V + 2 * H});
    mixed = part(proj, 0, {1, C});
    z = part(proj, C, {H, dv});
    b = part(proj, C + V, {1, H});
    a = part(proj, C + V + H, {1, H});
    if (!projected.defined()) ops::linear(x, w.in_all, proj.reshape({1, C + V + 2 * H}));
    ops::causal_conv1d(mixed, w.conv, rows, state.conv, true, conv, device);
    const Tensor flat = conv.reshape({C});
    q = part(flat, 0, {1, Hk, dk});
    k = part(flat, Hk * dk, {1, Hk, dk});
    v = part(flat, 2 * Hk * dk, {1, H, dv});
    // use_qk_l2norm_in_kernel, the gates and the recurrent step in one pass.
    Tensor core = scratch.get("gdn.core", {1, H, dv});
    ops::gated_delta_rule_step(q, k, v, a, b, w.a_log, w.dt_bias, 1e-6f, 1.0f / std::sqrt(float(dk)), rows,
                               state.state, core, device);
    ops::gated_rms_norm(core.reshape({H, dv}), z, w.norm, s.norm_eps, core.reshape({H, dv}));
    return core.reshape({1, H * dv});
  } else {
    AUGUR_ASSERT(!projected.defined(), "gated_deltanet_mix: a projection made ahead needs one token and in_all");
    mixed = scratch.get("gdn.mixed", {T, C});
    z = scratch.get("gdn.z", {T * H, dv});
    b = scratch.get("gdn.b", {T, H});
    a = scratch.get("gdn.a", {T, H});
    if (w.in_all.defined()) {
      Tensor proj = scratch.get("gdn.proj", {T, C + V + 2 * H});
      ops::linear(x, w.in_all, proj);
      ops::slice_cols(proj, 0, mixed);
      ops::slice_cols(proj, C, z.reshape({T, V}));
      ops::slice_cols(proj, C + V, b);
      ops::slice_cols(proj, C + V + H, a);
    } else {
      ops::linear(x, w.in_qkv, mixed);
      ops::linear(x, w.in_z, z.reshape({T, V}));
      ops::linear(x, w.in_b, b);
      ops::linear(x, w.in_a, a);
    }
    // Causal conv + SiLU over the carried tail, then split into heads.
    ops::causal_conv1d(mixed, w.conv, rows, state.conv, true, conv, device);
    q = scratch.get("gdn.q", {T, Hk, dk});
    k = scratch.get("gdn.k", {T, Hk, dk});
    v = scratch.get("gdn.v", {T, H, dv});
    ops::slice_cols(conv, 0, q.reshape({T, Hk * dk}));
    ops::slice_cols(conv, s.key_dim(), k.reshape({T, Hk * dk}));
    ops::slice_cols(conv, 2 * s.key_dim(), v.reshape({T, H * dv}));
    // use_qk_l2norm_in_kernel: l2norm with eps 1e-6 on every q and k head.
    ops::l2norm(q.reshape({T * Hk, dk}), 1e-6f, q.reshape({T * Hk, dk}));
    ops::l2norm(k.reshape({T * Hk, dk}), 1e-6f, k.reshape({T * Hk, dk}));
  }

  // g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)
  Tensor g = scratch.get("gdn.g", {T, H});
  Tensor beta = scratch.get("gdn.beta", {T, H});
  ops::delta_rule_gates(a, b, w.a_log, w.dt_bias, g, beta);

  // The delta rule, each row in the form its length asks for.
  std::vector<ops::RecurrentRow> short_rows, long_rows;
  for (const auto& r : rows) (r.n_tokens <= kRecurrentFormMaxTokens ? short_rows : long_rows).push_back(r);
  Tensor core = scratch.get("gdn.core", {T, H, dv});
  const float scale = 1.0f / std::sqrt(float(dk));
  if (!short_rows.empty())
    ops::gated_delta_rule_recurrent(q, k, v, g, beta, scale, short_rows, state.state, core, device);
  if (!long_rows.empty())
    ops::gated_delta_rule_chunked(q, k, v, g, beta, scale, kDeltaRuleChunk, long_rows, state.state, core, device);

  // Gated RMSNorm per value head (out_proj follows in the caller).
  ops::gated_rms_norm(core.reshape({T * H, dv}), z, w.norm, s.norm_eps, core.reshape({T * H, dv}));
  return core.reshape({T, H * dv});
}

void gated_deltanet_block(const Tensor& x, const GatedDeltaNetWeights& w, const GatedDeltaNetShape& s,
                          std::span<const ops::RecurrentRow> rows, const ops::RecurrentLayer& state,
                          const Tensor& out, Scratch& scratch, const ops::DeviceBatch* device) {
  ops::linear(gated_deltanet_mix(x, w, s, rows, state, scratch, device), w.out, out);
}

}  // namespace augur
