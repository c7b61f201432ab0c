"""Token-level correctness: only policy tokens carry loss, generated ids survive, and the loss applies
exactly the ERPO advantages (masked trajectories change nothing)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from envforge.server import Fleet, load_env
from envforge.trainer import (
    IM_END,
    FleetRolloutEnv,
    Generation,
    HFBackend,
    Learner,
    LearnerConfig,
    RolloutConfig,
    SequenceBuilder,
    bandit_corpus,
    bandit_tasks,
    build_tiny_model,
    clipped_pg_loss,
    erpo_advantages,
    load_tokenizer,
    parse_tool_call,
    token_logprobs,
    unbatched_session,
    write_bandit_env,
)
from envforge.trainer.rollout import rollout

from support.trajectories import ROWS, on_policy_rows


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("m"), bandit_corpus(), base_corpus=False, seed=1)


@pytest.fixture(scope="module")
def tok(model_dir: Path):
    return load_tokenizer(model_dir)


class Scripted:
    """A backend that returns fixed token ids (with made-up logprobs) and records them."""

    def __init__(self, turns: list[list[int]], eos_id: int) -> None:
        self.turns = list(turns)
        self.eos_id = eos_id
        self.version = 3
        self.prompts: list[list[int]] = []

    def session(self):
        return unbatched_session()

    async def generate(self, prompt_ids: list[int], *, max_new_tokens: int, seed=None, session=None):
        self.prompts.append(list(prompt_ids))
        ids = self.turns.pop(0)
        return Generation(token_ids=ids, logprobs=[-0.5 - i for i in range(len(ids))], version=self.version)


async def test_only_generated_tokens_carry_loss(tmp_path: Path, tok) -> None:
    fleet = Fleet([load_env(write_bandit_env(tmp_path))])
    tasks = await bandit_tasks(fleet, "bandit")
    env = FleetRolloutEnv(fleet, "bandit", tasks)
    green, red = tok.convert_tokens_to_ids("press_green"), tok.convert_tokens_to_ids("press_red")
    eos = tok.convert_tokens_to_ids(IM_END)
    # turn 1 ends with eos; turn 2 hits the length limit (no eos): `<|im_end|>` is then context
    backend = Scripted([[green, eos], [red]], eos)
    traj = await rollout(env, tasks[0].id, backend, tok, RolloutConfig(max_turns=2, max_new_tokens=2))
    assert len(traj.token_ids) == len(traj.logprobs) == len(traj.loss_mask)
    policy = [(i, t) for i, (t, m) in enumerate(zip(traj.token_ids, traj.loss_mask, strict=True)) if m]
    assert [t for _, t in policy] == [green, eos, red]
    assert [traj.logprobs[i] for i, _ in policy] == [-0.5, -1.5, -0.5]
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if not m)
    # the second prompt is exactly the first sequence so far: prefix-stable, nothing re-tokenized
    assert backend.prompts[1] == traj.token_ids[: len(backend.prompts[1])]
    assert backend.prompts[0] == backend.prompts[1][: len(backend.prompts[0])]
    # sequence = concatenation of separately tokenized segments + generated ids
    b = SequenceBuilder(tok)
    for m in traj.messages[:2]:
        b.add_message(m["role"], m["content"])
    b.open_assistant()
    b.add_generated([green, eos], [-0.5, -1.5])
    b.close_assistant(True)
    b.add_message("tool", "pressed")
    b.open_assistant()
    b.add_generated([red], [-0.5])
    b.close_assistant(False)
    b.add_message("tool", "pressed")
    assert b.token_ids == traj.token_ids and b.loss_mask == traj.loss_mask
    assert traj.policy_version == 3 and traj.reward == 0.0  # pressed green then red: state differs
    assert [m["role"] for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant", "tool"]


async def test_sampled_ids_survive_into_the_trajectory(tmp_path: Path, model_dir: Path, tok) -> None:
    fleet = Fleet([load_env(write_bandit_env(tmp_path))])
    tasks = await bandit_tasks(fleet, "bandit")
    env = FleetRolloutEnv(fleet, "bandit", tasks, use_mcp=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    hf = HFBackend(model, eos_id=tok.eos_token_id, seed=5)
    seen: list[list[int]] = []

    class Recording:
        eos_id = hf.eos_id
        version = 0

        def session(self):
            return hf.session()

        async def generate(self, prompt_ids, *, max_new_tokens, seed=None, session=None):
            g = await hf.generate(prompt_ids, max_new_tokens=max_new_tokens, session=session)
            seen.append(g.token_ids)
            return g

    traj = await rollout(env, tasks[0].id, Recording(), tok, RolloutConfig(max_turns=3, max_new_tokens=5))
    assert sum(len(s) for s in seen) == sum(traj.loss_mask) > 0
    assert traj.policy_tokens() == [t for s in seen for t in s]
    # the stored logprobs are the model's own (sampling at temperature 1)
    ids = torch.tensor([traj.token_ids])
    lp = token_logprobs(model, ids, torch.ones_like(ids), 1.0)[0]
    mask = torch.tensor(traj.loss_mask[1:], dtype=torch.bool)
    assert torch.allclose(lp[mask], torch.tensor(traj.logprobs[1:])[mask], atol=1e-4)


def test_parse_tool_call() -> None:
    names = ["press_green", "get_account"]
    assert parse_tool_call("press_green", names) == ("press_green", {})
    assert parse_tool_call('get_account {"account_id": "A-1"}', names) == (
        "get_account",
        {"account_id": "A-1"},
    )
    assert parse_tool_call('<tool_call>{"name": "x", "arguments": {"a": 1}}</tool_call>', names) == (
        "x",
        {"a": 1},
    )
    assert parse_tool_call("press_green press_red", names) is None
    assert parse_tool_call("hello", names) is None


def test_loss_applies_exactly_the_erpo_advantages(model_dir: Path, tok) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    trajs = on_policy_rows(model, tok, ROWS)
    want = erpo_advantages(
        [r[2] for r in ROWS], [r[0] for r in ROWS], [r[1] for r in ROWS], [r[3] for r in ROWS]
    )
    learner = Learner(copy.deepcopy(model), LearnerConfig(lr=0.0), pad_id=tok.pad_token_id)
    res = learner.step(trajs)
    assert res.advantages == pytest.approx(want)
    assert res.tokens == 5 * 7  # the masked trajectory's tokens are not counted
    assert res.ratio_mean == pytest.approx(1.0, abs=1e-4)
    for t, a, per_tok in zip(trajs, want, res.token_advantages, strict=True):
        assert per_tok == pytest.approx([a * m * (not t.user_error) for m in t.loss_mask])
    # and the gradient of the loss w.r.t. each token's logprob is -A / n_tokens at ratio 1
    new_lp = torch.zeros(len(trajs), 10, requires_grad=True)
    adv = torch.tensor(res.token_advantages)
    mask = torch.tensor([[m * (not t.user_error) for m in t.loss_mask] for t in trajs], dtype=torch.float32)
    loss, _, _ = clipped_pg_loss(new_lp, torch.zeros(len(trajs), 10), adv, mask, res.tokens, 0.2, 0.2)
    loss.backward()
    applied = -new_lp.grad * res.tokens
    for i, a in enumerate(want):
        assert applied[i, 5:].tolist() == pytest.approx([0.0 if ROWS[i][3] else a] * 5, abs=1e-6)
        assert applied[i, :5].abs().sum() == 0


def test_masked_trajectory_does_not_change_the_update(model_dir: Path, tok) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    trajs = on_policy_rows(model, tok, ROWS)
    kept = [t for t in trajs if not t.user_error]
    weird = trajs[3].model_copy(update={"reward": 100.0})
    a = Learner(copy.deepcopy(model), LearnerConfig(lr=0.05), pad_id=tok.pad_token_id)
    b = Learner(copy.deepcopy(model), LearnerConfig(lr=0.05), pad_id=tok.pad_token_id)
    a.step(kept)
    b.step([*trajs[:3], weird, *trajs[4:]])
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), n
    changed = any(
        not torch.equal(p, q) for p, q in zip(a.model.parameters(), model.parameters(), strict=True)
    )
    assert changed


def test_logprobs_from_a_later_start_equal_the_full_ones_there(model_dir: Path) -> None:
    """The update computes logits only from the first generated token on (the prompt's logits over
    the whole vocabulary were most of its memory): there, the values are the full computation's."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = torch.randint(3, model.config.vocab_size, (3, 24))
    attn = torch.ones_like(ids)
    attn[2, 20:] = 0  # a shorter row, padded at the end
    full = token_logprobs(model, ids, attn, 0.7)
    for start in (1, 9, 22):
        part = token_logprobs(model, ids, attn, 0.7, start=start)
        assert part.shape == full.shape
        assert torch.allclose(part[:, start:], full[:, start:], atol=1e-5)
        assert not part[:, :start].any()
