"""The `judge` verifier: a model scores each completion against a rubric, and the score is parsed from its reply.

Two backends, chosen by `JudgeConfig.backend`:
- "openai": any OpenAI-compatible chat-completions endpoint (a vLLM server, a hosted API): POST
  `<url>/chat/completions` with `{"model", "messages", "temperature": 0, "max_tokens"}`.
- "local": a transformers causal LM loaded from `model` (a local directory or a cached hub id), greedy.

Where the settings come from: `options["judge"]` (a JudgeConfig or a dict of its fields), else the environment
(POSTTRAIN_JUDGE_URL, POSTTRAIN_JUDGE_MODEL, POSTTRAIN_JUDGE_BACKEND, POSTTRAIN_JUDGE_API_KEY,
POSTTRAIN_JUDGE_TIMEOUT_S), so a deployment points every stage at its judge without touching task sets. A task
may carry its own rubric: `metadata["judge"] = {"rubric": "...", "max_score": 5}`.

The rubric is a `str.format` template over {prompt}, {completion}, {reference} and {answer}; the reply's score is
the number after "score" (`Score: 7`, `score = 7/10`), else a lone `N/M`, else the last number; divided by
`max_score` and clipped to [0, 1]. A reply without a score is None (not applicable: a weighted reward leaves the
judge out for that row). Requests are deduplicated and sent `concurrency` at a time, each with a timeout; results
are cached per (model, rendered prompt). An unreachable judge raises `JudgeUnavailable` naming the URL and
the cause: a reward that silently became 0 would train the policy on noise.
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from training.rewards.base import REWARDS, Verifier, register_verifier

DEFAULT_RUBRIC = (
    "You are grading an answer.\n\nTask:\n{prompt}\n\nReference answer (may be empty):\n{reference}\n\n"
    "Answer to grade:\n{completion}\n\nRate the answer's correctness and helpfulness from 0 to 10. "
    "Reply with one line: Score: <0-10>"
)
BACKENDS = ("openai", "local")
_SCORE_RE = re.compile(r"score\s*[:=]?\s*(-?\d+(?:\.\d+)?)(?:\s*/\s*(\d+(?:\.\d+)?))?", re.IGNORECASE)
_RATIO_RE = re.compile(r"(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")
_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


class JudgeUnavailable(RuntimeError):
    """The judge cannot be reached or loaded; the message says which and why."""


@dataclass(frozen=True)
class JudgeConfig:
    """How to reach the judge and read its verdict.

    backend:     "openai" (an OpenAI-compatible endpoint at `url`) or "local" (a transformers model at `model`).
    url:         base URL of the endpoint, e.g. http://127.0.0.1:8000/v1 (`/chat/completions` is appended).
    model:       the model name the endpoint serves, or the local model's directory / hub id.
    api_key:     sent as a Bearer token when set.
    rubric:      the prompt template ({prompt}, {completion}, {reference}, {answer}).
    max_score:   the top of the rubric's scale (the parsed score is divided by it).
    timeout_s:   per request; concurrency: requests in flight; max_tokens: the judge's reply budget.
    retries:     extra attempts after a timeout or connection error before the judge counts as unreachable.
    """

    backend: str = "openai"
    url: str = ""
    model: str = ""
    api_key: str = ""
    rubric: str = DEFAULT_RUBRIC
    max_score: float = 10.0
    timeout_s: float = 30.0
    concurrency: int = 8
    max_tokens: int = 32
    retries: int = 1

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"judge backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.max_score <= 0 or self.timeout_s <= 0 or self.concurrency < 1:
            raise ValueError("judge max_score and timeout_s must be > 0, concurrency >= 1")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> JudgeConfig:
        env = dict(os.environ if env is None else env)
        url, model = env.get("POSTTRAIN_JUDGE_URL", ""), env.get("POSTTRAIN_JUDGE_MODEL", "")
        backend = env.get("POSTTRAIN_JUDGE_BACKEND") or ("openai" if url or not model else "local")
        return cls(
            backend=backend,
            url=url,
            model=model,
            api_key=env.get("POSTTRAIN_JUDGE_API_KEY", ""),
            timeout_s=float(env.get("POSTTRAIN_JUDGE_TIMEOUT_S", "30")),
        )

    @classmethod
    def resolve(cls, value: Any) -> JudgeConfig:
        if isinstance(value, JudgeConfig):
            return value
        if isinstance(value, dict):
            base = cls.from_env()
            unknown = set(value) - {f.name for f in fields(cls)}
            if unknown:
                raise ValueError(f"unknown judge setting(s) {sorted(unknown)}")
            return replace(base, **value)
        return cls.from_env()


def parse_score(reply: str, max_score: float) -> float | None:
    """The score in a judge's reply, in [0, 1]; None when it states none."""
    if not isinstance(reply, str):
        return None
    m = _SCORE_RE.search(reply)
    if m:
        value, scale = float(m.group(1)), float(m.group(2)) if m.group(2) else max_score
    elif (r := _RATIO_RE.search(reply)) is not None:
        value, scale = float(r.group(1)), float(r.group(2))
    else:
        numbers = _NUMBER_RE.findall(reply)
        if not numbers:
            return None
        value, scale = float(numbers[-1]), max_score
    if scale <= 0:
        return None
    return min(1.0, max(0.0, value / scale))


def render(rubric: str, task: Any, completion: str) -> str:
    values = {
        "prompt": task.prompt,
        "completion": completion,
        "reference": getattr(task, "reference", "") or "",
        "answer": task.answer or "",
    }
    return rubric.format(**values)


class _OpenAIClient:
    def __init__(self, cfg: JudgeConfig) -> None:
        if not cfg.url:
            raise JudgeUnavailable(
                "no judge endpoint: set POSTTRAIN_JUDGE_URL (an OpenAI-compatible base URL, "
                "e.g. http://127.0.0.1:8000/v1) or pass judge={'url': ...}"
            )
        self.cfg = cfg
        self.endpoint = cfg.url.rstrip("/") + "/chat/completions"

    def _one(self, prompt: str) -> str:
        body = json.dumps(
            {
                "model": self.cfg.model or "judge",
                "temperature": 0,
                "max_tokens": self.cfg.max_tokens,
                "messages": [{"role": "user", "content": prompt}],
            }
        ).encode()
        headers = {"Content-Type": "application/json"}
        if self.cfg.api_key:
            headers["Authorization"] = f"Bearer {self.cfg.api_key}"
        last: Exception | None = None
        for _ in range(self.cfg.retries + 1):
            request = urllib.request.Request(self.endpoint, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.cfg.timeout_s) as response:
                    data = json.loads(response.read())
                return str(data["choices"][0]["message"]["content"] or "")
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    raise JudgeUnavailable(
                        f"judge at {self.endpoint} refused the request: HTTP {exc.code} {exc.read()[:200]!r}"
                    ) from None
                last = exc
            except (urllib.error.URLError, TimeoutError, OSError) as exc:
                last = exc
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise JudgeUnavailable(
                    f"judge at {self.endpoint} did not answer in the chat-completions format: {exc}"
                ) from None
        reason = getattr(last, "reason", last)
        raise JudgeUnavailable(
            f"judge at {self.endpoint} is unreachable after {self.cfg.retries + 1} attempt(s) "
            f"(timeout {self.cfg.timeout_s:g}s): {reason}"
        )

    def complete(self, prompts: Sequence[str]) -> list[str]:
        with ThreadPoolExecutor(max_workers=min(self.cfg.concurrency, max(1, len(prompts)))) as pool:
            return list(pool.map(self._one, prompts))


class _LocalClient:
    def __init__(self, cfg: JudgeConfig) -> None:
        if not cfg.model:
            raise JudgeUnavailable("no local judge model: set POSTTRAIN_JUDGE_MODEL or judge={'model': <dir>}")
        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(cfg.model)
            self.model = AutoModelForCausalLM.from_pretrained(cfg.model).eval()
        except Exception as exc:  # noqa: BLE001 - any loading failure means no judge
            raise JudgeUnavailable(f"cannot load the local judge model {cfg.model!r}: {exc}") from None
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        self.cfg = cfg

    def complete(self, prompts: Sequence[str]) -> list[str]:
        import torch

        out: list[str] = []
        size = max(1, self.cfg.concurrency)
        for start in range(0, len(prompts), size):
            chunk = list(prompts[start : start + size])
            if getattr(self.tokenizer, "chat_template", None):
                chunk = [
                    str(
                        self.tokenizer.apply_chat_template(
                            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
                        )
                    )
                    for p in chunk
                ]
            batch = self.tokenizer(chunk, return_tensors="pt", padding=True)
            with torch.no_grad():
                ids = self.model.generate(
                    **batch,
                    max_new_tokens=self.cfg.max_tokens,
                    do_sample=False,
                    pad_token_id=self.tokenizer.pad_token_id,
                )
            out += self.tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        return out


class JudgeVerifier(Verifier):
    name = "judge"
    any_task = True
    pass_threshold: ClassVar[float] = 0.5

    def __init__(self, cache_size: int = 65536) -> None:
        self.cache: OrderedDict[tuple[str, str, str], str] = OrderedDict()  # (url, model, prompt) -> reply
        self.cache_size = cache_size
        self.clients: dict[JudgeConfig, Any] = {}
        self.lock = threading.Lock()
        self.unparsed = 0

    def _client(self, cfg: JudgeConfig) -> Any:
        with self.lock:
            if cfg not in self.clients:
                self.clients[cfg] = _OpenAIClient(cfg) if cfg.backend == "openai" else _LocalClient(cfg)
            return self.clients[cfg]

    def score(
        self, tasks: Sequence[Any], completions: Sequence[str], *, judge: Any = None, **_: Any
    ) -> list[float | None]:
        cfg = JudgeConfig.resolve(judge)
        rendered: list[tuple[str, float]] = []
        for task, completion in zip(tasks, completions):
            own = task.metadata.get("judge") if isinstance(task.metadata, dict) else None
            rubric = (own or {}).get("rubric", cfg.rubric)
            rendered.append((render(rubric, task, completion), float((own or {}).get("max_score", cfg.max_score))))
        todo = list(dict.fromkeys(p for p, _ in rendered if (cfg.url, cfg.model, p) not in self.cache))
        replies = dict(zip(todo, self._client(cfg).complete(todo))) if todo else {}
        with self.lock:
            for prompt, reply in replies.items():
                self.cache[(cfg.url, cfg.model, prompt)] = reply
            found = {p: replies.get(p, self.cache.get((cfg.url, cfg.model, p))) for p, _ in rendered}
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        out: list[float | None] = []
        for prompt, max_score in rendered:
            reply = found[prompt]
            value = parse_score(reply, max_score) if reply is not None else None
            self.unparsed += value is None
            out.append(value)
        return out


JUDGE = JudgeVerifier()
register_verifier(JUDGE)
judge_reward = REWARDS["judge"]
