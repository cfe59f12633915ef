"""RoPE and the sinusoid table, as the notes define them."""

import dataclasses
import math

import pytest
import torch
from _support import attention_layer, self_attend

from lm.config.sections import ModelConfig
from lm.model.masks import (
    Mask,
    Positions,
    masks,
    positions,
    positions_from_mask,
    positions_from_segments,
    random_positions,
)
from lm.model.schemes.biases import FIRE, KERPLE, T5, ALiBi, alibi_slopes, t5_bucket
from lm.model.schemes.embeddings import sinusoidal_table
from lm.model.schemes.rope import (
    RoPE,
    RopeAngles,
    ntk_base,
    rope_frequencies,
    rotate_pairs,
    yarn_attention_factor,
    yarn_frequencies,
)


def apply(rope: RopeAngles, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``rope`` on queries or keys ``x [..., L, d_k]`` at positions ``[L]`` or ``[B, L]``."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return rotate_pairs(x, *rope.cos_sin(positions, dtype))


def apply_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The notes' RoPE."""
    return apply(RopeAngles(x.shape[-1]), x, positions)


def test_sinusoid_table_matches_the_formula():
    d, L = 8, 12
    p = sinusoidal_table(L, d, dtype=torch.float64)
    for pos in range(L):
        for i in range(d // 2):
            w = 10000 ** (-2 * i / d)
            assert math.isclose(p[pos, 2 * i].item(), math.sin(pos * w), abs_tol=1e-12)
            assert math.isclose(p[pos, 2 * i + 1].item(), math.cos(pos * w), abs_tol=1e-12)
    # The notes' d=4 picture: position 0 is [0, 1, 0, 1].
    torch.testing.assert_close(sinusoidal_table(6, 4)[0], torch.tensor([0.0, 1.0, 0.0, 1.0]))


def test_rope_rotates_interleaved_pairs_by_position_times_theta():
    dk = 4
    x = torch.tensor([[1.0, 0.0, 1.0, 0.0]]).double()
    out = apply_rope(x, torch.tensor([3]))
    for i in range(dk // 2):
        angle = 3 * 10000 ** (-2 * i / dk)
        assert math.isclose(out[0, 2 * i].item(), math.cos(angle), abs_tol=1e-6)
        assert math.isclose(out[0, 2 * i + 1].item(), math.sin(angle), abs_tol=1e-6)


def test_rope_scores_depend_only_on_the_offset_and_preserve_norms():
    torch.manual_seed(0)
    q, k = torch.randn(16).double(), torch.randn(16).double()

    def score(l, s):
        ql = apply_rope(q[None], torch.tensor([l]))[0]
        ks = apply_rope(k[None], torch.tensor([s]))[0]
        return (ql @ ks).item()

    for l, s in [(1, 3), (0, 7), (5, 2)]:
        for shift in (1, 10, 100):
            assert math.isclose(
                score(l, s), score(l + shift, s + shift), rel_tol=1e-9, abs_tol=1e-9
            )
    x = torch.randn(5, 16).double()
    rotated = apply_rope(x, torch.arange(5) * 13)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))


def test_rope_batch_positions_match_per_row_positions():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8)  # (B, H, L, d_k)
    pos = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])
    out = apply_rope(x, pos)
    for b in range(2):
        torch.testing.assert_close(out[b], apply_rope(x[b], pos[b]))


def test_rope_is_applied_to_queries_and_keys_not_values():
    from lm.model.kernels import attention
    from lm.model.masks import causal_mask

    torch.manual_seed(0)
    mha, cfg = attention_layer(8, 2, position="rope", kernel="math")
    x = torch.randn(1, 5, 8)
    positions = torch.tensor([0, 3, 4, 9, 10])
    # The layer's output is the notes' formula with q and k rotated at their positions and v
    # left as it is.
    q, k, v = mha.project(x)
    q, k = apply_rope(q, positions), apply_rope(k, positions)
    y, _ = attention(q, k, v, causal_mask(5))
    expected = mha.out(y.transpose(1, 2).flatten(2))
    got = self_attend(mha, cfg, x, positions=positions)
    torch.testing.assert_close(got, expected)
    # Where the tokens sit changes the output; shifting them all together does not.
    assert not torch.allclose(got, self_attend(mha, cfg, x, positions=torch.arange(5)))
    torch.testing.assert_close(self_attend(mha, cfg, x, positions=positions + 37), got)


def test_alibi_slopes_and_bias():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    assert alibi_slopes(6).shape == (6,)
    cfg = ModelConfig(d_model=8, n_head=2, position="alibi")
    part = ALiBi(cfg)
    b = _added(part, cfg, 3, causal=False)  # -m_h |l - j|, as the kernel adds it
    assert b.shape == (1, 2, 3, 3)
    torch.testing.assert_close(b[0, 0, 2], torch.tensor([-2 * 2**-4, -(2**-4), 0.0]))


def test_t5_buckets_are_exact_then_logarithmic_up_to_the_max_distance():
    # 32 buckets, max distance 128 (Raffel et al.): distances 0..15 have a bucket each; then
    # 16 + floor(log(n/16) / log(128/16) * 16): n=20 -> 16 + floor(1.717) = 17, n=32 -> 16 +
    # floor(16/3) = 21, n=64 -> 16 + floor(32/3) = 26, n=127 -> 16 + floor(15.94) = 31; from
    # n=128 on, the last bucket. A key after its query (n < 0) falls in bucket 0.
    n = torch.tensor([0, 1, 15, 16, 20, 32, 64, 127, 128, 1000, -3])
    assert t5_bucket(n).tolist() == [0, 1, 15, 16, 17, 21, 26, 31, 31, 31, 0]
    # 8 buckets up to 20: 0..3 exact, then 4 + floor(log(n/4) / log(5) * 4): n=9 -> 6, n=19 -> 7.
    assert t5_bucket(torch.tensor([3, 4, 9, 19, 20, 50]), 8, 20).tolist() == [3, 4, 6, 7, 7, 7]


def test_t5_bias_is_each_heads_learned_scalar_of_the_distance_bucket():
    cfg = ModelConfig(d_model=8, n_head=2, position="t5", t5_buckets=8, t5_max_distance=20)
    part = T5(cfg)
    with torch.no_grad():  # b_h[bucket] = 100 h + bucket: each entry names where it came from
        part.table.copy_(100 * torch.arange(2.0)[:, None] + torch.arange(8.0))
    b = _added(part, cfg, 30)  # (1, H, 30, 30), the causal mask's -inf included
    assert b[0, 0, 29, 29] == 0 and b[0, 1, 29, 29] == 100  # distance 0
    assert b[0, 0, 29, 26] == 3 and b[0, 1, 29, 20] == 106 and b[0, 0, 29, 0] == 7  # 3, 9, 29
    assert torch.isinf(b[0, :, 0, 1]).all()  # a future key stays blocked


def test_t5_shares_one_table_across_layers_built_once_per_forward(monkeypatch):
    from lm.model.transformer import TransformerLM

    cfg = dict(vocab_size=20, context_length=16, n_layer=3, n_head=2, d_model=16)
    model = TransformerLM(ModelConfig(**cfg, position="t5"))
    tables = [n for n, _ in model.named_parameters() if "position" in n]
    assert tables == ["blocks.0.attn.position.table"]  # one table [heads, buckets]
    assert model.num_parameters() == TransformerLM(ModelConfig(**cfg)).num_parameters() + 2 * 32
    calls = []
    real = T5.formula
    monkeypatch.setattr(T5, "formula", staticmethod(lambda *a: calls.append(1) or real(*a)))
    model(torch.randint(0, 20, (2, 9))).sum().backward()
    assert len(calls) == 1  # built once, read by the three layers
    assert model.blocks[0].attn.position.table.grad.abs().sum() > 0


def test_kerple_log_bias_is_minus_r1_log_1_plus_r2_distance_per_layer():
    from lm.model.transformer import TransformerLM

    cfg = ModelConfig(vocab_size=20, d_model=8, n_layer=2, n_head=2, position="kerple")
    part = KERPLE(cfg)
    with torch.no_grad():
        part.r1.copy_(torch.tensor([1.0, 2.0]))
        part.r2.copy_(torch.tensor([0.5, 1.0]))
    b = _added(part, cfg, 4)  # (1, H, 4, 4)
    # distance 2: head 0 -1 log(1 + 0.5 * 2) = -log 2, head 1 -2 log(1 + 2) = -2 log 3
    torch.testing.assert_close(b[0, :, 3, 1], torch.tensor([-math.log(2), -2 * math.log(3)]))
    assert (b[0, :, 2, 2] == 0).all() and torch.isinf(b[0, :, 1, 2]).all()  # d = 0; the future
    # r1, r2 used at no less than 0.01, the gradient still reaching a parameter below that.
    with torch.no_grad():
        part.r2.copy_(torch.tensor([-1.0, 1.0]))
    b = _added(part, cfg, 4)
    torch.testing.assert_close(b[0, 0, 3, 1], torch.tensor(-math.log(1 + 0.02)))
    b[0, 0, 3, 1].backward()
    assert part.r2.grad[0] != 0
    # Each layer its own r1, r2 (the paper's code has them in every attention layer).
    model = TransformerLM(cfg)
    names = [n for n, _ in model.named_parameters() if ".position." in n]
    assert names == [f"blocks.{i}.attn.position.{r}" for i in (0, 1) for r in ("r1", "r2")]


def test_fire_bias_is_its_mlp_of_the_log_distance_over_the_log_query_position():
    cfg = ModelConfig(d_model=8, n_head=1, position="fire", fire_width=2, fire_threshold=4.0)
    part = FIRE(cfg)
    with torch.no_grad():  # f(x) = 0.25 + 2 relu(x) + 3 relu(0.5 - x); psi(x) = log(x + 1)
        for name, value in (("w1", [1.0, -1.0]), ("b1", [0.0, 0.5]), ("w2", [[2.0, 3.0]])):
            getattr(part, name).copy_(torch.tensor(value))
        part.b2.fill_(0.25)
        part.c.fill_(1.0)
    b = _added(part, cfg, 20)[0, 0]  # (20, 20)
    # i = 2, j = 0: x = psi(2) / psi(max(L=4, 2)) = log 3 / log 5 -> 0.25 + 2x
    torch.testing.assert_close(b[2, 0], torch.tensor(0.25 + 2 * math.log(3) / math.log(5)))
    # distance 0: x = 0 -> 0.25 + 3 * 0.5; the whole context back: x = 1 -> 0.25 + 2, at i = 9
    # as at i = 19 (progressive interpolation: every length maps into [0, 1])
    torch.testing.assert_close(b[9, 9], torch.tensor(1.75))
    torch.testing.assert_close(b[9, 0], torch.tensor(2.25))
    torch.testing.assert_close(b[19, 0], torch.tensor(2.25))
    # below the threshold the query position does not normalise: psi(max(4, 3)) = psi(4)
    x = math.log(2) / math.log(5)  # 0.43: both hidden units fire
    torch.testing.assert_close(b[3, 2], torch.tensor(0.25 + 2 * x + 3 * (0.5 - x)))
    assert torch.isinf(b[2, 3])  # the future stays blocked
    # c and L are learned: the bias has a gradient for both (and for the MLP).
    b[9, 3].backward()
    assert part.c.grad.abs() > 0 and part.w1.grad.abs().sum() > 0
    b = _added(part, cfg, 20)[0, 0]
    b[3, 2].backward()
    assert part.threshold_scale.grad.abs() > 0


def test_positions_count_real_tokens_only_and_restart_at_each_document():
    key_mask = torch.tensor([[False, False, True, True, True], [True, True, True, False, False]])
    # Left pads take the position of the first real token; right pads that of the next one.
    assert positions_from_mask(key_mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]
    # Decoding on: each row continues after its own count of real tokens.
    ones = torch.ones(2, 2, dtype=torch.bool)
    assert positions_from_mask(ones, torch.tensor([3, 5])).tolist() == [[3, 4], [5, 6]]
    segments = torch.tensor([[0, 0, 0, 1, 1, 2], [4, 4, 4, 4, 4, 4]])
    assert positions_from_segments(segments).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]


def test_random_positions_are_a_sorted_draw_of_distinct_positions_per_sequence_and_document():
    torch.manual_seed(0)
    key_mask = torch.tensor(
        [[False, False, True, True, True, True], [True, True, False] + [False] * 3]
    )
    segments = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    tops = []
    for _ in range(200):
        p = random_positions(2, 6, 64, key_mask, segments)
        assert ((p >= 0) & (p < 64)).all()
        for run in (p[0, 2:3], p[0, 3:6], p[1, :2]):  # a document's real tokens, or a row's
            assert (run[1:] > run[:-1]).all()  # distinct, ascending
        tops.append(p[1, 1].item())
    # Each run draws from all of [0, 64) whatever the row's length: the last of the two real
    # tokens of row 1 reaches the top of the range, as 2 positions drawn from 64 do.
    assert max(tops) >= 60 and min(tops) <= 8
    whole = random_positions(1, 6, 6)  # as many positions as the range: 0..5 exactly
    assert whole.tolist() == [[0, 1, 2, 3, 4, 5]]


def test_random_positions_in_training_only_and_the_trained_model_reads_0_to_l():
    from lm.model.transformer import TransformerLM

    cfg = ModelConfig(vocab_size=20, context_length=8, n_layer=2, n_head=2, d_model=16)
    randomized = ModelConfig(**{**dataclasses.asdict(cfg), "random_positions": 64})
    ids = torch.zeros(3, 8, dtype=torch.long)
    torch.manual_seed(1)
    drawn = positions(randomized, ids, training=True)
    assert drawn.queries.shape == (3, 8) and drawn.limit == 64
    assert drawn.queries.max() > 7
    assert positions(randomized, ids).queries.tolist() == list(range(8))  # not training
    for position in ("rope", "learned", "alibi"):
        torch.manual_seed(0)
        trained = TransformerLM(dataclasses.replace(randomized, position=position)).eval()
        torch.manual_seed(0)
        plain = TransformerLM(dataclasses.replace(cfg, position=position)).eval()
        state = trained.state_dict()
        if position == "learned":  # its table has a row for each of the 64 positions
            assert state["pos_embed.weight"].shape == (64, 16)
            state["pos_embed.weight"] = state["pos_embed.weight"][:8]
        plain.load_state_dict(state)
        x = torch.randint(0, 20, (2, 8))
        with torch.no_grad():
            torch.testing.assert_close(trained(x), plain(x))  # evaluation: positions 0..7


# RoPE past its trained context: PI, NTK-aware, YaRN; partial RoPE.


def same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    """Bit-for-bit equal tensors, pair by pair (cos with cos, sin with sin)."""
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


EXTENDED = [
    RopeAngles(8, method="pi", factor=4.0),
    RopeAngles(8, method="ntk", factor=4.0),
    RopeAngles(8, method="yarn", factor=4.0, context=64),
    RopeAngles(8, pairs=2),
    RopeAngles(8, pairs=2, method="yarn", factor=4.0, context=64),
]


def test_pi_angles_are_positions_over_s_times_theta():
    cos, sin = RopeAngles(4, method="pi", factor=4.0).cos_sin(torch.tensor([6]), torch.float64)
    for i, theta in enumerate((1.0, 0.01)):  # 10000^(-2i/4)
        assert math.isclose(cos[0, i].item(), math.cos(6 / 4 * theta), abs_tol=1e-15)
        assert math.isclose(sin[0, i].item(), math.sin(6 / 4 * theta), abs_tol=1e-15)


def test_pi_at_factor_s_is_plain_rope_at_positions_m_over_s():
    torch.manual_seed(0)
    x, m = torch.randn(2, 3, 10, 8), torch.arange(10)
    for s in (2.0, 4.0, 2.5):
        pi = apply(RopeAngles(8, method="pi", factor=s), x, m)
        assert torch.equal(pi, apply_rope(x, m.double() / s))


def test_ntk_raises_the_base_by_s_to_the_d_over_d_minus_2():
    theta = RopeAngles(8, base=10000.0, method="ntk", factor=4.0).frequencies()
    base = 10000.0 * 4.0 ** (8 / 6)
    expected = [base ** (-2 * i / 8) for i in range(4)]
    torch.testing.assert_close(theta, torch.tensor(expected, dtype=torch.float64))
    plain = rope_frequencies(8)
    assert theta[0] == plain[0] == 1.0  # the fastest pair keeps its frequency
    assert math.isclose(theta[-1].item(), plain[-1].item() / 4.0, rel_tol=1e-12)  # slowest / s
    assert ntk_base(10000.0, 4.0, 2) == 10000.0  # one pair: theta_0 = 1 whatever the base


def test_yarn_ramp_below_between_and_above_the_thresholds():
    L, s = 64, 4.0
    turns = torch.tensor([0.5, 1.0, 16.5, 32.0, 40.0], dtype=torch.float64)  # r = L / lambda
    theta = turns * 2 * math.pi / L
    got = yarn_frequencies(theta, s, L)  # alpha 1, beta 32
    gamma = [0.0, 0.0, 0.5, 1.0, 1.0]  # (r - 1) / 31, clamped to [0, 1]
    expected = [(1 - g) * t / s + g * t for g, t in zip(gamma, theta.tolist(), strict=True)]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
    assert got[0] == theta[0] / s and got[-1] == theta[-1]  # interpolated as PI / left alone
    # A head of 2 pairs trained at 64: theta = (1, 0.01) turn r = 64 theta / 2 pi = 10.19 and
    # 0.10 times, so the slow pair is divided by s and the fast one only partly.
    g = (64 / (2 * math.pi) - 1) / 31
    torch.testing.assert_close(
        RopeAngles(4, method="yarn", factor=s, context=L).frequencies(),
        torch.tensor([(1 - g) / s + g, 0.01 / s], dtype=torch.float64),
    )


def test_yarn_multiplies_the_logits_by_its_temperature():
    s = 4.0
    assert yarn_attention_factor(s) == 0.1 * math.log(s) + 1
    torch.manual_seed(0)
    q, k = torch.randn(1, 8).double(), torch.randn(1, 8).double()
    yarn = RopeAngles(8, method="yarn", factor=s, context=64)
    zero = torch.tensor([0])  # every angle is 0 there: only the temperature is left
    score = (apply(yarn, q, zero) * apply(yarn, k, zero)).sum().item()
    assert math.isclose(score, (0.1 * math.log(s) + 1) ** 2 * (q * k).sum().item(), rel_tol=1e-12)


@pytest.mark.parametrize("method", ["pi", "ntk", "yarn"])
def test_factor_1_is_the_notes_rope_exactly(method):
    positions = torch.tensor([[0, 3, 17, 1000], [5, 5, 6, 7]])
    plain = RopeAngles(16).cos_sin(positions)
    assert same(RopeAngles(16, method=method, factor=1.0, context=8).cos_sin(positions), plain)
    theta = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)  # the notes' theta_i
    assert torch.equal(plain[0], torch.cos(positions.double()[..., None] * theta).float())


def test_partial_rope_rotates_the_first_pairs_only():
    torch.manual_seed(0)
    x = torch.randn(5, 8).double()
    out = apply(RopeAngles(8, pairs=2), x, torch.arange(5) * 7)
    assert torch.equal(out[:, 4:], x[:, 4:])  # pairs 2 and 3 unrotated
    # The rotated pairs span the whole range of frequencies over their own width d = 4.
    torch.testing.assert_close(out[:, :4], apply_rope(x[:, :4], torch.arange(5) * 7))
    assert torch.equal(
        RopeAngles(8, pairs=4).cos_sin(torch.arange(9))[0],
        RopeAngles(8).cos_sin(torch.arange(9))[0],
    )


@pytest.mark.parametrize("rope", EXTENDED, ids=lambda r: f"{r.method}:{r.factor:g}/{r.pairs}")
def test_every_extension_keeps_scores_a_function_of_the_offset(rope):
    torch.manual_seed(0)
    q, k = torch.randn(8).double(), torch.randn(8).double()

    def score(l, s):
        return (
            apply(rope, q[None], torch.tensor([l]))[0] @ apply(rope, k[None], torch.tensor([s]))[0]
        ).item()

    for l, s in [(1, 3), (0, 7), (5, 2)]:
        for shift in (1, 10, 300):
            assert math.isclose(
                score(l, s), score(l + shift, s + shift), rel_tol=1e-9, abs_tol=1e-9
            )


def test_the_cache_equals_the_angles_computed_at_any_length():
    cfg = ModelConfig(
        d_model=16, n_head=2, context_length=16, rope_scaling="yarn:2", rope_original_context=16
    )
    rope, part = RopeAngles(8, method="yarn", factor=2.0, context=16), RoPE(cfg)
    assert part.rope == rope

    def rotated(positions, end):  # a pair (1, 0) turned by each angle: (cos, sin)
        where = Positions(positions, positions, end, 2, (positions, positions))
        x = torch.tensor([1.0, 0.0]).repeat(positions.shape[-1], 4)  # (L, d_k)
        q, _ = part.rotate(x, x, where)
        return q[..., 0::2], q[..., 1::2]

    inside = torch.tensor([[0, 4, 15], [1, 1, 2]])
    assert same(rotated(inside, 16), rope.cos_sin(inside))
    beyond = torch.arange(40)
    assert same(rotated(beyond, 40), rope.cos_sin(beyond))
    assert "cos" not in part.state_dict()  # recomputed, never saved in checkpoints


# The schemes of 2023-25, each against its paper's formula written out by hand.


def _pass(cfg: ModelConfig, T: int, causal: bool = True) -> tuple[Positions, Mask]:
    """Where T tokens sit and the first window's mask, for the explicit formula."""
    ids = torch.zeros(1, T, dtype=torch.long)
    where = positions(cfg, ids)
    return where, masks(cfg, where, causal=causal, kernel="math")[cfg.layer_windows[0]]


def _added(part, cfg: ModelConfig, T: int, causal: bool = True) -> torch.Tensor:
    """``M + B`` as the kernel adds them to ``S``: the scheme's bias, -inf where ``M`` blocks."""
    where, mask = _pass(cfg, T, causal)
    b = part.bias(where, mask)
    return b if mask.allowed is None else b.masked_fill(~mask.allowed, float("-inf"))


def test_sandwich_is_the_inner_product_of_the_notes_sinusoids_scaled_per_head():
    from lm.model.schemes.biases import Sandwich, sandwich_table

    cfg = ModelConfig(d_model=4, n_head=2, position="sandwich")
    # d = 4: w = (1, 1/100); p_l . p_j = cos(n) + cos(n/100), less d/2 = 2, at distance n.
    table = sandwich_table(3, 4)
    for n in range(3):
        assert table[n].item() == pytest.approx(math.cos(n) + math.cos(n / 100) - 2)
    p = sinusoidal_table(6, 4).double()
    assert (p[5] @ p[3] - 2).item() == pytest.approx(table[2].item())  # the notes' p_l . p_j
    part = Sandwich(cfg)
    b = _added(part, cfg, 3)  # (1, H, 3, 3), -inf above the diagonal
    for h, scale in enumerate((2 / 8, 2 / 16)):  # H / (8 h), h = 1, 2
        assert b[0, h, 2].tolist() == pytest.approx([scale * table[n].item() for n in (2, 1, 0)])
    assert torch.isinf(b[0, 0, 0, 1])


def test_xpos_decays_each_pair_by_zeta_to_the_offset_over_b():
    from lm.model.schemes.rope import XPos, xpos_decay

    cfg = ModelConfig(d_model=8, n_head=2, position="xpos", xpos_scale_base=4.0)
    zeta = xpos_decay(4)  # d_k = 4: (2i/d_k + 0.4) / 1.4 for pairs i = 0, 1
    assert zeta.tolist() == pytest.approx([0.4 / 1.4, 0.9 / 1.4])
    part = XPos(cfg)
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 4)
    qx, kx = part.rotate(q, k, _pass(cfg, 6)[0])
    qr, kr = apply_rope(q, torch.arange(6)), apply_rope(k, torch.arange(6))
    for l, j in ((5, 2), (3, 0), (4, 4)):
        for i in (0, 1):  # pair i alone: RoPE's score times zeta_i^((l - j)/B)
            pair = slice(2 * i, 2 * i + 2)
            rope = (qr[0, 0, l, pair] @ kr[0, 0, j, pair]).item()
            xpos = (qx[0, 0, l, pair] @ kx[0, 0, j, pair]).item()
            assert xpos == pytest.approx(rope * zeta[i].item() ** ((l - j) / 4), rel=1e-5)


def test_p_rope_rotates_the_fastest_pairs_at_the_notes_frequencies_and_leaves_the_rest():
    p_rope = RopeAngles(8, kept=2).frequencies()
    assert p_rope.tolist() == pytest.approx([1.0, 10000**-0.25, 0.0, 0.0])  # theta_i of d_k 8
    partial = RopeAngles(8, pairs=2).frequencies()  # rope_fraction re-spaces over 2 pairs
    assert partial.tolist() == pytest.approx([1.0, 10000**-0.5, 0.0, 0.0])
    cfg = ModelConfig(d_model=16, n_head=2, rope_p=0.5)
    assert RoPE(cfg).rope == RopeAngles(8, kept=2)
    x = torch.randn(5, 8)
    out = apply(RopeAngles(8, kept=2), x, torch.arange(5) * 3)
    assert torch.equal(out[:, 4:], x[:, 4:])  # the slowest pairs: not rotated


def test_fox_adds_the_log_forget_gates_between_key_and_query():
    from lm.model.schemes.content import FoX

    cfg = ModelConfig(d_model=4, n_head=2, position="fox")
    part = FoX(cfg, 0)
    torch.manual_seed(0)
    x = torch.randn(1, 4, 4)
    where, mask = _pass(cfg, 4)
    b = part.score_bias(where, mask, x, None, None)  # (1, H, 4, 4)
    f = torch.sigmoid(part.gate(x))[0]  # (T, H): f_t per head
    for h in range(2):
        for i in range(4):
            for j in range(i + 1):  # sum over t = j+1 .. i of log f_t
                want = sum(math.log(f[t, h].item()) for t in range(j + 1, i + 1))
                assert b[0, h, i, j].item() == pytest.approx(want, abs=1e-6)
    assert not mask.allowed[0, 1]  # the future stays masked, by M


def test_cope_counts_the_gates_from_each_key_and_interpolates_its_embedding():
    from lm.model.schemes.content import CoPE

    cfg = ModelConfig(d_model=4, n_head=1, position="cope", cope_max=3)
    part = CoPE(cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        part.table.copy_(torch.randn(4, 3))
    q, k = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    b = part.score_bias(*_pass(cfg, 3), None, q, k)[0, 0]
    gates = torch.sigmoid(q[0, 0] @ k[0, 0].T / 2)  # g_ij, d_k = 4
    for i in range(3):
        for j in range(i + 1):
            p = min(sum(gates[i, t].item() for t in range(j, i + 1)), 2.0)  # clamped below 3
            lo, hi = math.floor(p), math.ceil(p)
            e = part.table[:, lo] * (1 - (p - lo)) + part.table[:, hi] * (p - lo)
            assert b[i, j].item() == pytest.approx((q[0, 0, i] @ e).item() / 2, rel=1e-5)


def test_ssmax_scales_each_querys_scores_by_s_log_of_the_keys_it_reads():
    _, cfg = attention_layer(8, 2, position="none", normalize="ssmax", kernel="math")
    from lm.model.normalize import SSMax

    part = SSMax(cfg)
    q = torch.randn(1, 2, 5, 4)
    scaled = part.scale(q, _pass(cfg, 5)[1])
    for l in range(5):  # query l reads keys 0 .. l: n = l + 1; s starts at 0.43
        torch.testing.assert_close(scaled[0, :, l], q[0, :, l] * 0.43 * math.log(l + 1))
    windowed = _pass(dataclasses.replace(cfg, window=2), 5)[1]
    assert windowed.keys_read.flatten().tolist() == [1, 2, 2, 2, 2]  # at most the window


def test_stick_breaking_gives_each_key_its_share_of_what_the_later_keys_left():
    from lm.model.kernels import stick_breaking

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 3, 4), torch.randn(1, 3, 4), torch.randn(1, 3, 2)
    causal = torch.ones(3, 3, dtype=torch.bool).tril()
    y, a = stick_breaking(q, k, v, causal)
    z = (q @ k.transpose(-2, -1) / 2)[0]
    s = torch.sigmoid(z)
    for i in range(3):
        for j in range(i + 1):  # sigma(z_ij) prod_{j < m <= i} (1 - sigma(z_im))
            want = s[i, j].item() * math.prod(1 - s[i, m].item() for m in range(j + 1, i + 1))
            assert a[0, i, j].item() == pytest.approx(want, rel=1e-5)
    assert (a[0].sum(-1) <= 1 + 1e-6).all() and a[0, 0, 1] == 0
    torch.testing.assert_close(y, a @ v)


def test_a_sliding_window_reads_the_last_w_real_tokens():
    cfg = ModelConfig(d_model=8, n_head=2, n_layer=2, window=[2, None])
    key_mask = torch.tensor([[False, True, True, True, True]])  # left padding: one pad
    ids = torch.zeros(1, 5, dtype=torch.long)
    M = masks(cfg, positions(cfg, ids, key_mask), key_mask, kernel="math")
    near = M[2].allowed[0, 0]
    assert near[4].tolist() == [False, False, False, True, True]  # itself and one before
    assert near[1].tolist() == [False, True, False, False, False]  # the first real token
    assert M[None].allowed[0, 0, 4].tolist() == [False, True, True, True, True]


def test_pope_scores_are_content_magnitudes_times_the_cosine_of_position_phases():
    from lm.model.schemes.pope import PoPE

    cfg = ModelConfig(d_model=6, n_head=2, position="pope")  # d_k = 3: PoPE needs no pairs
    part = PoPE(cfg, 0)
    torch.manual_seed(0)
    with torch.no_grad():
        part.offset.copy_(torch.randn(2, 3))
    q, k = torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 3)
    q2, k2 = part.rotate(q, k, _pass(cfg, 4)[0])
    assert q2.shape == k2.shape == (1, 2, 4, 6)
    got = q2 @ k2.transpose(-2, -1) / math.sqrt(6)  # what every kernel computes
    sp = torch.nn.functional.softplus
    for h in range(2):
        for t in range(4):
            for s in range(4):
                want = sum(
                    sp(q[0, h, t, c]).item()
                    * sp(k[0, h, s, c]).item()
                    * math.cos((s - t) * 10000 ** (-c / 3) + part.offset[h, c].item())
                    for c in range(3)
                ) / math.sqrt(3)
                assert got[0, h, t, s].item() == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_fope_multiplies_each_pair_by_a_fourier_series_with_the_slow_waves_clipped():
    from lm.model.schemes.fope import FoPE

    # d_k = 4: omega = (1, 1/100); with context 16, 1/100 < 2 pi/16 is clipped to 0.
    cfg = ModelConfig(d_model=8, n_head=2, context_length=16, position="fope")
    torch.manual_seed(0)
    part = FoPE(cfg, 0)
    assert part.omega.tolist() == [1.0, 0.0]
    a = part.coefficients.double()
    assert a[:, 0, 0].tolist() == a[:, 1, 1].tolist() == [1.0, 1.0]
    x = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    q, _ = part.rotate(x, x, _pass(cfg, 5)[0])
    for h in range(2):
        for n in range(5):
            for m in range(2):  # pair m times sum_w a_hmw e^(i omega_w n)
                f = a[h, m, 0].item() * complex(math.cos(n), math.sin(n)) + a[h, m, 1].item()
                z = complex(x[0, h, n, 2 * m].item(), x[0, h, n, 2 * m + 1].item()) * f
                got = complex(q[0, h, n, 2 * m].item(), q[0, h, n, 2 * m + 1].item())
                assert abs(got - z) < 1e-5


def test_an_odd_head_width_is_refused_by_the_schemes_that_pair_features():
    from lm.config.errors import ConfigError

    for position in ("rope", "fope"):
        with pytest.raises(ConfigError, match=f"model.position: {position} needs an even head"):
            ModelConfig(d_model=6, n_head=2, position=position)
    ModelConfig(d_model=6, n_head=2, position="pope")  # PoPE gives each feature its own phase


def test_hope_is_p_rope_keeping_the_pairs_that_turn_within_the_trained_context():
    from lm.model.schemes.hope import HoPE, hope_kept_pairs
    from lm.model.transformer import TransformerLM

    # d_k = 8: theta = 1, 0.1, 0.01, 0.001; periods 2 pi / theta = 6.3, 63, 628, 6283.
    assert [hope_kept_pairs(8, 10000.0, L) for L in (6, 7, 62, 63, 629)] == [0, 1, 1, 2, 3]
    shape = dict(vocab_size=11, d_model=16, n_head=2, n_layer=2, context_length=16)
    torch.manual_seed(0)
    hope = TransformerLM(ModelConfig(**shape, position="hope")).eval()
    torch.manual_seed(0)
    p_rope = TransformerLM(ModelConfig(**shape, position="rope", rope_p=0.25)).eval()  # 1 of 4
    ids = torch.randint(0, 11, (2, 40))  # past the context: the cut holds there too
    assert torch.equal(hope(ids), p_rope(ids))
    # Beside RoPE, in a model of both, each layer reads its own angles: HoPE's slow pairs stay put.
    both = TransformerLM(ModelConfig(**shape, position=["rope", "hope"])).eval()
    rope, hope = (block.attn.position for block in both.blocks)
    assert isinstance(hope, HoPE) and not isinstance(rope, HoPE)
    assert (hope.cos[:, 1:] == 1).all() and not (rope.cos[:, 1:] == 1).all()  # (L, d_k/2)


def test_fope_without_its_drawn_coefficients_is_hope():
    # FoPE clips the frequencies that HoPE leaves unturned (less than a period over the trained
    # context), so with its Fourier coefficients the identity the two are one model: what FoPE
    # adds to HoPE is the drawn coefficients alone (docs/claims.md row 9 reads its numbers so).
    from lm.model.transformer import TransformerLM

    shape = dict(vocab_size=11, d_model=32, n_head=2, n_layer=2, context_length=16)
    torch.manual_seed(0)
    fope = TransformerLM(ModelConfig(**shape, position="fope")).eval()
    torch.manual_seed(0)
    hope = TransformerLM(ModelConfig(**shape, position="hope")).eval()
    ids = torch.randint(0, 11, (2, 48))  # past the context too
    missing, unexpected = fope.load_state_dict(hope.state_dict(), strict=False)
    assert unexpected == [] and missing and all(k.endswith("coefficients") for k in missing)
    assert not torch.allclose(fope(ids), hope(ids), atol=1e-3)  # the drawn series differ
    for name, buffer in fope.named_buffers():
        if name.endswith("coefficients"):
            buffer.copy_(torch.eye(buffer.shape[-1]).expand_as(buffer))
    torch.testing.assert_close(fope(ids), hope(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("static", ["kerple", "alibi"])
def test_dape_adds_the_static_bias_and_an_mlp_of_every_heads_score_and_bias(static):
    from lm.model.schemes.dape import DAPE

    cfg = ModelConfig(d_model=8, n_head=2, position="dape", dape_bias=static)
    torch.manual_seed(0)
    part = DAPE(cfg, 0)
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    where, mask = _pass(cfg, 3)
    got = part.score_bias(where, mask, None, q, k)[0]  # (H, 3, 3)
    w1, b1 = part.mix[0].weight, part.mix[0].bias
    w2, b2 = part.mix[2].weight, part.mix[2].bias
    for i in range(3):
        for j in range(i + 1):
            s = [(q[0, h, i] @ k[0, h, j]).item() / 2 for h in range(2)]  # d_k = 4
            if static == "kerple":
                r1, r2 = part.r1.clamp(min=0.01), part.r2.clamp(min=0.01)
                b = [-r1[h].item() * math.log(1 + r2[h].item() * (i - j)) for h in range(2)]
            else:
                b = [-alibi_slopes(2)[h].item() * (i - j) for h in range(2)]
            z = torch.tensor(s + b)  # [S_1, S_2, B_1, B_2]: every head's score, then bias
            hidden = [
                torch.nn.functional.gelu(w1[u] @ z + b1[u]).item() for u in range(w1.shape[0])
            ]
            for h in range(2):
                f = sum(w2[h, u].item() * hidden[u] for u in range(len(hidden))) + b2[h].item()
                assert got[h, i, j].item() == pytest.approx(b[h] + f, abs=1e-5)
    assert not mask.allowed[0, 1]  # the future stays masked, by M


def test_dape_needs_a_static_bias_it_can_read_and_a_kernel_that_sees_every_head():
    from lm.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model\.dape_bias: 't5' is not one of kerple, alibi"):
        ModelConfig(position="dape", dape_bias="t5")
    with pytest.raises(ConfigError, match=r"model\.kernel: flex cannot compute dape's bias"):
        ModelConfig(position="dape", kernel="flex")


def test_path_scores_each_key_through_the_householder_products_of_the_tokens_between():
    from lm.model.schemes.path import PaTH

    cfg = ModelConfig(d_model=6, n_head=2, position="path")  # d_k = 3
    torch.manual_seed(0)
    part = PaTH(cfg, 0)
    x, q, k = torch.randn(1, 4, 6), torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 3)
    where, mask = _pass(cfg, 4)
    bias = part.score_bias(where, mask, x, q, k)[0]  # (H, 4, 4)
    w = part.direction(x)[0].view(4, 2, 3)  # (T, H, d_k), before normalising
    beta = 2 * torch.sigmoid(part.strength(x)[0])  # (T, H)
    for h in range(2):
        H = [
            torch.eye(3) - beta[t, h] * torch.outer(w[t, h], w[t, h]) / (w[t, h] @ w[t, h])
            for t in range(4)
        ]
        for i in range(4):
            for j in range(i + 1):
                product = torch.eye(3)
                for t in range(j + 1, i + 1):  # H_{j+1} H_{j+2} ... H_i
                    product = product @ H[t]
                score = (k[0, h, j] @ product @ q[0, h, i]).item() / math.sqrt(3)
                plain = (q[0, h, i] @ k[0, h, j]).item() / math.sqrt(3)  # what the kernel adds
                assert bias[h, i, j].item() + plain == pytest.approx(score, abs=1e-5)
    assert not mask.allowed[0, 1]  # the future stays masked, by M
    assert (beta > 0).all() and (beta < 2).all()


@pytest.mark.parametrize(
    ("Lq", "Lk", "start"),
    [(64, 64, 0), (512, 512, 0), (5, 12, 3), (7, 7, 0), (3, 20, 17)],
    ids=["training", "8x-trained", "a-prompt-after-cached-tokens", "short", "last-slots"],
)
def test_path_ut_form_equals_the_direct_form_values_and_gradients(Lq, Lk, start):
    from lm.model.schemes.path import path_scores, path_scores_ut

    torch.manual_seed(Lq + Lk)
    q, k = torch.randn(2, 3, Lq, 8), torch.randn(2, 3, Lk, 8)
    w = torch.nn.functional.normalize(torch.randn(2, 3, Lk, 8), dim=-1)
    beta = 2 * torch.rand(2, 3, Lk)  # across (0, 2): reflections and near-identities
    beta[0, 0, ::3] = 0.0  # padding slots: the identity
    inputs = [t.double().requires_grad_() for t in (q, k, w, beta)]
    direct, ut = path_scores(*inputs, start), path_scores_ut(*inputs, start)
    torch.testing.assert_close(ut, direct, rtol=1e-9, atol=1e-9)
    weights = torch.randn_like(direct)  # a loss that reads every score
    want = torch.autograd.grad((direct * weights).sum(), inputs)
    got = torch.autograd.grad((ut * weights).sum(), inputs)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
    # in float32, as training computes it, to float32 rounding at every length
    ut32 = path_scores_ut(q, k, w, beta, start)
    torch.testing.assert_close(ut32.double(), direct.detach(), rtol=1e-4, atol=2e-4)


def test_path_is_refused_where_it_cannot_run():
    from lm.config.errors import ConfigError
    from lm.model.transformer import TransformerLM

    with pytest.raises(ConfigError, match=r"model\.kernel: flex cannot compute path's bias"):
        ModelConfig(position="path", kernel="flex")
    with pytest.raises(ConfigError, match=r"model\.normalize: ssmax scales q\.k"):
        TransformerLM(ModelConfig(vocab_size=11, position="path", normalize="ssmax"))
