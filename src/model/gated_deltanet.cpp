#include "model/gated_deltanet.h"

#include <cmath>
#include <vector>

namespace augur {

void gated_deltanet_block(const Tensor& x, const GatedDeltaNetWeights& w, const GatedDeltaNetShape& s,
                          std::span<const ops::RecurrentRow> rows, const ops::RecurrentLayer& state,
                          const Tensor& out, Scratch& scratch) {
  const int64_t T = x.dim(0), H = s.n_head, Hk = s.n_head_k, dk = s.head_dim_k, dv = s.head_dim_v;
  // Projections.
  Tensor mixed = scratch.get("gdn.mixed", {T, s.conv_dim()});  // q, k, v before the conv
  Tensor z = scratch.get("gdn.z", {T * H, dv});
  Tensor b = scratch.get("gdn.b", {T, H});
  Tensor a = scratch.get("gdn.a", {T, H});
  ops::linear(x, w.in_qkv, mixed);
  ops::linear(x, w.in_z, z.reshape({T, H * dv}));
  ops::linear(x, w.in_b, b);
  ops::linear(x, w.in_a, a);

  // Causal conv + SiLU over the carried tail, then split into heads.
  Tensor conv = scratch.get("gdn.conv", {T, s.conv_dim()});
  ops::causal_conv1d(mixed, w.conv, rows, state.conv, true, conv);
  Tensor q = scratch.get("gdn.q", {T, Hk, dk});
  Tensor k = scratch.get("gdn.k", {T, Hk, dk});
  Tensor v = scratch.get("gdn.v", {T, H, dv});
  ops::slice_cols(conv, 0, q.reshape({T, Hk * dk}));
  ops::slice_cols(conv, s.key_dim(), k.reshape({T, Hk * dk}));
  ops::slice_cols(conv, 2 * s.key_dim(), v.reshape({T, H * dv}));
  // use_qk_l2norm_in_kernel: l2norm with eps 1e-6 on every q and k head.
  ops::l2norm(q.reshape({T * Hk, dk}), 1e-6f, q.reshape({T * Hk, dk}));
  ops::l2norm(k.reshape({T * Hk, dk}), 1e-6f, k.reshape({T * Hk, dk}));

  // g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)
  Tensor g = scratch.get("gdn.g", {T, H});
  Tensor beta = scratch.get("gdn.beta", {T, H});
  ops::delta_rule_gates(a, b, w.a_log, w.dt_bias, g, beta);

  // The delta rule, each row in the form its length asks for.
  std::vector<ops::RecurrentRow> short_rows, long_rows;
  for (const auto& r : rows) (r.n_tokens <= kRecurrentFormMaxTokens ? short_rows : long_rows).push_back(r);
  Tensor core = scratch.get("gdn.core", {T, H, dv});
  const float scale = 1.0f / std::sqrt(float(dk));
  if (!short_rows.empty()) ops::gated_delta_rule_recurrent(q, k, v, g, beta, scale, short_rows, state.state, core);
  if (!long_rows.empty())
    ops::gated_delta_rule_chunked(q, k, v, g, beta, scale, kDeltaRuleChunk, long_rows, state.state, core);

  // Gated RMSNorm per value head, then out_proj.
  ops::gated_rms_norm(core.reshape({T * H, dv}), z, w.norm, s.norm_eps, core.reshape({T * H, dv}));
  ops::linear(core.reshape({T, H * dv}), w.out, out);
}

}  // namespace augur
