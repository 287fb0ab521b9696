#include "model/gated_deltanet.h"

#include <algorithm>
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

struct Heads {
  Tensor q, k, v;  // [T, n_head_k, head_dim_k] x 2, [T, n_head, head_dim_v]
};

// Causal conv + SiLU over the carried tail, then split into q, k, v heads.
// mixed: [T, conv_dim]
Heads conv_heads(const Tensor& mixed, const GatedDeltaNetWeights& w, const GatedDeltaNetShape& s,
                 std::span<const ops::RecurrentRow> rows, const ops::RecurrentLayer& state, Scratch& scratch,
                 const ops::DeviceBatch* layout) {
  const int64_t T = mixed.dim(0), Hk = s.n_head_k, dk = s.head_dim_k;
  Tensor conv = scratch.get("gdn.conv", {T, s.conv_dim()});
  ops::causal_conv1d(mixed, w.conv, rows, state.conv, true, conv, layout);
  Heads h{scratch.get("gdn.q", {T, Hk, dk}), scratch.get("gdn.k", {T, Hk, dk}),
          scratch.get("gdn.v", {T, s.n_head, s.head_dim_v})};
  ops::slice_cols(conv, 0, h.q.reshape({T, Hk * dk}));
  ops::slice_cols(conv, s.key_dim(), h.k.reshape({T, Hk * dk}));
  ops::slice_cols(conv, 2 * s.key_dim(), h.v.reshape({T, s.value_dim()}));
  return h;
}

}  // namespace

Tensor gated_deltanet_mix(const Tensor& x, const GatedDeltaNetWeights& w, const GatedDeltaNetShape& s,
                          std::span<const ops::RecurrentRow> rows, const ops::RecurrentLayer& state, Scratch& scratch,
                          const ops::BatchView& batch, const Tensor& projected) {
  const int64_t T = x.dim(0), H = s.n_head, Hk = s.n_head_k, dk = s.head_dim_k, dv = s.head_dim_v;
  const int64_t C = s.conv_dim(), V = s.value_dim(), P = C + V + 2 * H;
  const auto* layout = batch.device;  // the batch as uploaded, if it was
  Tensor proj = projected.defined() ? projected : scratch.get("gdn.proj", {T, P});
  if (!projected.defined()) ops::linear(x, w.in_all, proj);
  // Verify windows leave their inputs in their slots' history: a rollback
  // replays only the recurrence over the tokens it keeps.
  if (state.inputs.defined() &&
      std::any_of(rows.begin(), rows.end(), [&](const ops::RecurrentRow& r) {
        return r.n_tokens >= 2 && r.n_tokens <= state.inputs.dim(1);
      }))
    ops::keep_recurrent_inputs(proj, C, V, rows, batch, state.inputs);
  if (T == 1) {
    // One token (a decode step): q, k, v, z, b, a read in place where they
    // lie back to back, and the gates, l2 norms and the recurrent step in one op.
    Tensor conv = scratch.get("gdn.conv", {T, C});
    const Tensor flat_proj = proj.reshape({P});
    const Tensor mixed = part(flat_proj, 0, {1, C});
    const Tensor z = part(flat_proj, C, {H, dv});
    const Tensor b = part(flat_proj, C + V, {1, H});
    const Tensor a = part(flat_proj, C + V + H, {1, H});
    ops::causal_conv1d(mixed, w.conv, rows, state.conv, true, conv, layout);
    const Tensor flat = conv.reshape({C});
    const Tensor q = part(flat, 0, {1, Hk, dk});
    const Tensor k = part(flat, Hk * dk, {1, Hk, dk});
    const Tensor v = part(flat, 2 * Hk * dk, {1, H, dv});
    Tensor core = scratch.get("gdn.core", {1, H, dv});
    ops::gated_delta_rule_step(q, k, v, a, b, w.a_log, w.dt_bias, 1e-6f, 1.0f / std::sqrt(float(dk)), rows,
                               state.state, core, layout);
    ops::gated_rms_norm(core.reshape({H, dv}), z, w.norm, s.norm_eps, core.reshape({H, dv}));
    return core.reshape({1, H * dv});
  }
  // The delta rule, each row in the form its length asks for. Short rows
  // (verify windows, short chunks) take the decode step's op, which folds
  // the q/k l2 norms and the gates into the recurrence: a token's result is
  // then bit-equal to what a one-token step gives it (a verify of drafts
  // agrees with plain decoding on every device).
  std::vector<ops::RecurrentRow> short_rows, long_rows;
  for (const auto& r : rows) (r.n_tokens <= kRecurrentFormMaxTokens ? short_rows : long_rows).push_back(r);
  Tensor core = scratch.get("gdn.core", {T, H, dv});
  const float scale = 1.0f / std::sqrt(float(dk));
  if (!short_rows.empty()) {
    Tensor mixed = scratch.get("gdn.mixed", {T, C});
    Tensor b = scratch.get("gdn.b", {T, H});
    Tensor a = scratch.get("gdn.a", {T, H});
    ops::slice_cols(proj, 0, mixed);
    ops::slice_cols(proj, C + V, b);
    ops::slice_cols(proj, C + V + H, a);
    const auto [q, k, v] = conv_heads(mixed, w, s, short_rows, state, scratch, layout);
    ops::gated_delta_rule_step(q, k, v, a, b, w.a_log, w.dt_bias, 1e-6f, scale, short_rows, state.state, core,
                               layout);
  }
  if (!long_rows.empty()) {
    // use_qk_l2norm_in_kernel: l2norm with eps 1e-6 on every q and k head;
    // g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b). Made from
    // proj in place, in one pass (a short row's tokens are not touched).
    Tensor q = scratch.get("gdn.q", {T, Hk, dk}), k = scratch.get("gdn.k", {T, Hk, dk});
    Tensor v = scratch.get("gdn.v", {T, H, dv});
    Tensor g = scratch.get("gdn.g", {T, H});
    Tensor beta = scratch.get("gdn.beta", {T, H});
    ops::delta_rule_inputs(proj, C + V, w.conv, w.a_log, w.dt_bias, 1e-6f, long_rows, state.conv, q, k, v, g, beta,
                           layout);
    ops::gated_delta_rule_chunked(q, k, v, g, beta, scale, kDeltaRuleChunk, long_rows, state.state, core, layout);
  }

  // Gated RMSNorm per value head, z read in place from proj (out_proj follows
  // in the caller).
  ops::gated_rms_norm(core.reshape({T * H, dv}), proj.slice_cols(C, C + V), w.norm, s.norm_eps,
                      core.reshape({T * H, dv}));
  return core.reshape({T, H * dv});
}

void gated_deltanet_replay(const GatedDeltaNetWeights& w, const GatedDeltaNetShape& s,
                           std::span<const ops::RecurrentRow> rows, const ops::RecurrentLayer& state, Scratch& scratch,
                           const ops::BatchView& batch) {
  const int64_t T = int64_t(batch.positions.size()), H = s.n_head, dk = s.head_dim_k, dv = s.head_dim_v;
  const int64_t C = s.conv_dim(), W = C + 2 * H;
  AUGUR_ASSERT(state.inputs.defined() && state.inputs.dim(2) == W, "input history of another shape");
  const auto* layout = batch.device;
  Tensor in = scratch.get("gdn.kept", {T, W});
  ops::load_recurrent_inputs(state.inputs, rows, batch, in);
  // The verify's own values, so the conv and the recurrence redo its arithmetic.
  Tensor mixed = scratch.get("gdn.mixed", {T, C});
  Tensor b = scratch.get("gdn.b", {T, H});
  Tensor a = scratch.get("gdn.a", {T, H});
  ops::slice_cols(in, 0, mixed);
  ops::slice_cols(in, C, b);
  ops::slice_cols(in, C + H, a);
  const auto [q, k, v] = conv_heads(mixed, w, s, rows, state, scratch, layout);
  Tensor core = scratch.get("gdn.core", {T, H, dv});  // not read: only the state matters
  ops::gated_delta_rule_step(q, k, v, a, b, w.a_log, w.dt_bias, 1e-6f, 1.0f / std::sqrt(float(dk)), rows, state.state,
                             core, layout);
}

}  // namespace augur
