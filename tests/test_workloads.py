"""The built-in workloads' data: what a run trains on must be the learnable task it says it is."""
from __future__ import annotations

import torch

from kit.experiments.choices import GPT_SEQ
from kit.experiments.measure.workloads import TeacherDataset
from kit.experiments.models import VOCAB


def _teacher(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.softmax(torch.randn(VOCAB, VOCAB, generator=g) * 3, dim=-1)  # the first draw of the dataset's


def test_gpt_tokens_follow_the_teachers_bigram_probabilities():
    data = TeacherDataset("gpt", 20_000, seed=3)
    assert data.x.shape == (20_000, GPT_SEQ) and torch.equal(data.x[:, 1:], data.y[:, :-1])  # y is x shifted by one
    prev, nxt = data.x.reshape(-1), data.y.reshape(-1)
    counts = torch.zeros(VOCAB, VOCAB).index_put_((prev, nxt), torch.ones(prev.numel()), accumulate=True)
    seen = counts.sum(1)
    rows = seen > 3000  # tokens seen often enough for their next-token frequencies to be estimates
    assert rows.sum() > 20
    freq = counts[rows] / seen[rows, None]
    p = _teacher(3)[rows]
    # binomial standard error of each frequency; 5 of them over ~10^4 cells only fails for a wrong sampler
    se = (p * (1 - p) / seen[rows, None]).sqrt() + 1e-4
    assert ((freq - p).abs() / se).max() < 5.5
    assert 0 <= nxt.min() and nxt.max() < VOCAB


def test_a_seed_gives_the_same_data_on_every_rank_and_another_seed_other_data():
    a, b, c = TeacherDataset("gpt", 256, 0), TeacherDataset("gpt", 256, 0), TeacherDataset("gpt", 256, 1)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.x, c.x)
