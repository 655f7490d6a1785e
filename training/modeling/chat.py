"""Prompts as conversations: how a task becomes the token ids a model is trained on and sampled from.

A pretrained chat model (Qwen2.5-Instruct, Llama-3-Instruct, ...) only answers well when its prompt is rendered
through its chat template, and it ends an answer with its end-of-turn token, not always with `eos_token`. So
every stage renders a task the same way, through one `PromptFormat`:

    fmt = PromptFormat(tokenizer, ChatSettings(system_prompt="", instructions={"math": "Put ... \\boxed{}."}))
    ids = fmt.prompt_ids(task)              # what the rollout engines receive (token ids, never text)
    example = fmt.sft_example(task)         # prompt ids + assistant ids, loss on the assistant turn only
    fmt.stop_ids                            # every id that ends a completion

When the tokenizer has a chat template, the user turn is the task prompt plus the domain's answer-format
instruction, after an optional system turn, and the assistant turn is the reference. The template is rendered
to text and tokenised without adding special tokens (the template writes its own BOS), as TRL does; the
assistant ids of an SFT example are the rendered conversation after the prompt, up to and including the first
stop id, so SFT trains exactly the ids that generation must produce to stop. Without a template, the prompt is
tokenised as it is (with the tokenizer's own special tokens, e.g. BOS) and the reference is followed by EOS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from training.tasksets.schema import Task


@dataclass(frozen=True)
class ChatSettings:
    """How tasks are rendered as conversations (used only when the tokenizer has a chat template).

    system_prompt: the system turn; "" = none.
    instructions:  per-domain answer-format instruction appended to the user turn after a blank line, e.g.
                   {"math": "Put the final answer in \\\\boxed{}."}; a domain not named gets none, unless
    from_verifiers: a domain not named in `instructions` gets its tasks' verifier's own (`Verifier.instruction`:
                   math's \\\\boxed{}, code's fenced block, a user's verifier's), resolved once by SFT and saved
                   with the model, so a domain a user adds is instructed without a setting naming it.
    """

    system_prompt: str = ""
    instructions: dict[str, str] = field(default_factory=dict)
    from_verifiers: bool = False


@dataclass
class SFTExample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is part of the assistant turn (predicted and trained on)


def _as_ids(encoded: Any) -> list[int]:
    return list(encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded)


def stop_token_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """Every id that ends a completion: the generation config's eos id(s) (Llama 3 and Qwen2.5 list two), the
    tokenizer's eos, and the chat template's end-of-turn token."""
    ids: list[int] = []
    gen_eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    for value in ([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])) + [tokenizer.eos_token_id]:
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    eot = end_of_turn_id(tokenizer)
    if eot is not None and eot not in ids:
        ids.append(eot)
    return ids


def end_of_turn_id(tokenizer: Any) -> int | None:
    """The special token the chat template writes right after an assistant message (`<|im_end|>` for ChatML,
    `<|eot_id|>` for Llama 3), found by rendering a sentinel message; None without a template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    sentinel = "zq7sentinel"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": sentinel}], tokenize=False
    )
    after = str(text).split(sentinel, 1)[-1]
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    for tid in _as_ids(tokenizer(after, add_special_tokens=False)):
        if tid in special:
            return int(tid)
    return None


class PromptFormat:
    """Renders tasks for one tokenizer; see the module docstring."""

    def __init__(self, tokenizer: Any, settings: ChatSettings | None = None, generation_config: Any = None) -> None:
        self.tokenizer = tokenizer
        self.settings = settings or ChatSettings()
        self.uses_template = bool(getattr(tokenizer, "chat_template", None))
        self.stop_ids = stop_token_ids(tokenizer, generation_config)

    # ----- conversations ---------------------------------------------------------------------------------
    def user_text(self, task: Task, prefix: str = "") -> str:
        """The user turn: `prefix` (e.g. long-context distractors), the prompt, the domain's instruction."""
        instruction = self.settings.instructions.get(task.domain, "")
        return f"{prefix}{task.prompt}" + (f"\n\n{instruction}" if instruction else "")

    def messages(self, task: Task, prefix: str = "") -> list[dict[str, str]]:
        out = [{"role": "system", "content": self.settings.system_prompt}] if self.settings.system_prompt else []
        return out + [{"role": "user", "content": self.user_text(task, prefix)}]

    def render(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Token ids of a conversation ending with a user turn, followed by the assistant generation prompt."""
        text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        return _as_ids(self.tokenizer(str(text), add_special_tokens=False))

    # ----- what the stages use ---------------------------------------------------------------------------
    def prompt_ids(self, task: Task, prefix: str = "") -> list[int]:
        """The ids a rollout engine receives for `task` (with `prefix` text in front of the prompt)."""
        if self.uses_template:
            return self.render(self.messages(task, prefix))
        return _as_ids(self.tokenizer(prefix + task.prompt))

    def follow_up_ids(self, task: Task, turns: Sequence[tuple[str, str]]) -> list[int]:
        """A conversation continued: the task, then (assistant answer, user reply) pairs, ready for the next
        answer. Without a template the turns are appended as plain text."""
        if self.uses_template:
            return self.render(self._conversation(task, "", turns))
        text = task.prompt + "".join(f"{answer}\n{reply}\n" for answer, reply in turns)
        return _as_ids(self.tokenizer(text))

    # ----- multi-turn episodes (training/environments) ----------------------------------------------------
    def episode_ids(self, task: Task, messages: Sequence[dict[str, str]]) -> list[int]:
        """The first prompt of an episode: an environment's opening `messages` (reset) rendered as `prompt_ids`
        renders a task: the system prompt, and the domain's instruction after the first user message. For
        `[{"role": "user", "content": task.prompt}]` this is exactly `prompt_ids(task)`."""
        first, rest = messages[0]["content"], list(messages[1:])
        if not self.uses_template:
            return _as_ids(self.tokenizer(first + "".join(m["content"] for m in rest)))
        opening = self.messages(Task(task.id, task.domain, first, task.verifier))
        return self.render(opening + rest)

    def answer_ids(self, answer: str) -> list[int]:
        """An assistant answer written elsewhere (a planted first attempt) as ids, without its end of turn:
        `reply_ids(..., stopped=False)` closes the turn after it."""
        return _as_ids(self.tokenizer(answer, add_special_tokens=False))

    def reply_ids(self, reply: str, stopped: bool) -> list[int]:
        """The tokens between a model's answer and its next one: the end of the assistant turn (unless the
        answer already ended with its stop token, `stopped`), the environment's `reply` as a user turn, and the
        next assistant generation prompt. Appended to the token ids the model saw and wrote, so a later turn's
        prompt extends the earlier one token for token (nothing re-tokenised: the trainer sees exactly what
        the engine saw, and vLLM's prefix cache reuses every earlier turn)."""
        if not self.uses_template:
            return _as_ids(self.tokenizer(f"\n{reply}\n", add_special_tokens=False))
        answer = "zq7answer"
        before = [{"role": "user", "content": "zq7task"}, {"role": "assistant", "content": answer}]
        closed = str(self.tokenizer.apply_chat_template(before, tokenize=False))
        full = str(
            self.tokenizer.apply_chat_template(
                before + [{"role": "user", "content": reply}], add_generation_prompt=True, tokenize=False
            )
        )
        if not full.startswith(closed):
            raise ValueError(
                "reply_ids: the chat template rewrites earlier turns when a turn is added; "
                "multi-turn episodes need a template that only appends"
            )
        after_answer = closed.split(answer)[-1]  # what the template writes after an answer: end-of-turn, "\n"
        if stopped:
            for stop in self.stop_ids:  # the model's own stop token already closes the turn
                text = self.tokenizer.decode([stop])
                if text and after_answer.startswith(text):
                    after_answer = after_answer[len(text) :]
                    break
        return _as_ids(self.tokenizer(after_answer + full[len(closed) :], add_special_tokens=False))

    def _conversation(self, task: Task, prefix: str, turns: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
        messages = self.messages(task, prefix)
        for answer, reply in turns:
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": reply}]
        return messages

    def sft_example(self, task: Task, prefix: str = "", turns: Sequence[tuple[str, str]] = ()) -> SFTExample:
        """The prompt (with `prefix` text, e.g. long-context distractors, in front; or continued by earlier
        (answer, reply) `turns`, e.g. a failed attempt and its error), then the reference as the assistant turn;
        loss on that last assistant turn only."""
        prompt = self.follow_up_ids(task, turns) if turns else self.prompt_ids(task, prefix)
        if not self.uses_template:
            answer = _as_ids(self.tokenizer(task.reference, add_special_tokens=False)) + [self.tokenizer.eos_token_id]
            return SFTExample(prompt + answer, [0] * len(prompt) + [1] * len(answer))
        conversation = self._conversation(task, prefix, turns)
        messages = conversation + [{"role": "assistant", "content": task.reference}]
        full_text = str(self.tokenizer.apply_chat_template(messages, tokenize=False))
        full = _as_ids(self.tokenizer(full_text, add_special_tokens=False))
        if full[: len(prompt)] == prompt:
            answer = full[len(prompt) :]
        else:  # a tokenizer that merges across the boundary: keep the prompt ids generation will see
            prompt_text = str(
                self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
            )
            answer = _as_ids(self.tokenizer(full_text[len(prompt_text) :], add_special_tokens=False))
        stops = [i for i, tid in enumerate(answer) if tid in self.stop_ids]
        if stops:  # the template may write more after the end-of-turn token ("\n"); generation stops there
            answer = answer[: stops[0] + 1]
        else:  # a template that writes no end-of-turn token: end the answer the way generation will stop
            answer = answer + [self.stop_ids[0]]
        return SFTExample(prompt + answer, [0] * len(prompt) + [1] * len(answer))


# The tiny profile's chat template: role tokens instead of ChatML's "<|im_start|>role\n" text, so a prompt
# costs two extra positions of the tiny model's 128, and the end of an assistant turn is its EOS.
TINY_ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
TINY_CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}<|system|>{{ m['content'] }}"
    "{%- elif m['role'] == 'user' -%}<|user|>{{ m['content'] }}"
    "{%- else -%}<|assistant|>{{ m['content'] }}<eos>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


def fitting_tasks(fmt: PromptFormat, tasks: list[Task], limit: int) -> tuple[list[Task], int]:
    """The tasks whose rendered prompt has at most `limit` tokens, and how many were dropped (never cut)."""
    kept = [t for t in tasks if len(fmt.prompt_ids(t)) <= limit]
    return kept, len(tasks) - len(kept)
