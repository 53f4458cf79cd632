"""The one token-weighted stats reduction (update/batch.py): stat_sums, add_sums, token_means,
merge_stats."""

from __future__ import annotations

import pytest

from slimgrpo.update.batch import UpdateStats, add_sums, merge_stats, stat_sums, token_means


def _stats(loss, kl, ent, tokens, clips, count, **extra):
    lo, hi, reg = clips
    return UpdateStats(loss=loss, kl=kl, entropy=ent, clip_ratio_low=lo, clip_ratio_high=hi, clip_ratio_region=reg,
                       tokens=tokens, clip_count=count, extra=dict(extra))


def test_token_means_of_one_part_gives_it_back():
    s = _stats(0.5, 0.25, 1.5, 8, (0.125, 0.25, 0.5), 4, cispo=0.75)
    assert token_means(stat_sums(s)) == s


def test_parts_weighted_by_tokens_and_clip_counts():
    a = _stats(1.0, 0.1, 2.0, 3, (0.0, 0.5, 0.5), 2, x=1.0)
    b = _stats(2.0, 0.4, 1.0, 1, (1.0, 0.0, 1.0), 6, x=0.0)
    r = token_means(add_sums(stat_sums(a), stat_sums(b)))
    assert r.loss == 3.0 and r.tokens == 4 and r.clip_count == 8  # the loss summed (shares of one loss)
    assert r.kl == pytest.approx((0.1 * 3 + 0.4) / 4) and r.entropy == pytest.approx((2.0 * 3 + 1.0) / 4)
    assert r.clip_ratio_low == pytest.approx(6 / 8) and r.clip_ratio_region == pytest.approx((1 + 6) / 8)
    assert r.extra == {"x": pytest.approx(2 / 8)}


def test_no_tokens_gives_zeros_not_nan():
    r = token_means(stat_sums(UpdateStats(loss=0.5)))
    assert (r.loss, r.kl, r.entropy, r.clip_ratio_low, r.tokens, r.clip_count) == (0.5, 0.0, 0.0, 0.0, 0, 0)


def test_merge_stats_averages_the_loss_over_steps():
    a = _stats(1.0, 0.1, 2.0, 3, (0.0, 0.5, 0.5), 2, x=1.0)
    b = _stats(2.0, 0.4, 1.0, 1, (1.0, 0.0, 1.0), 6, x=0.0)
    assert merge_stats([a]) is a
    m = merge_stats([a, b])
    assert m.loss == 1.5 and m.tokens == 4 and m.kl == pytest.approx(0.175) and m.extra == {"x": pytest.approx(0.25)}
