#!/usr/bin/env bash
# GPU smoke check for a lent CUDA machine (< 8 minutes, up to 5 more for the speed section 7 and 7 more for section 8): vLLM rollout
# engine + one GRPO step on CUDA.
#
#   bash infra/gpu-check.sh            # from the repository root; prints PASS/FAIL lines, exit 1 on any FAIL
#
# 1. installs the project (+ the `gpu` extra, vllm) into .venv-gpu unless torch+CUDA and vllm already import;
# 2. builds the tiny tokenizer + GPT-2 and saves it to a temp dir;
# 3. vLLM engine: generate, update weights from a perturbed state dict (in place), generate again (outputs
#    must change), update from a saved folder (outputs must match the HF engine's greedy output);
# 4. one GRPO step (training.stages.rl_round.Round.step) on CUDA with the HF engine, finite loss;
# 5. the pretrained-model path: a Qwen2-architecture model (~40M parameters) built from config with a ChatML
#    tokenizer (training/modeling/synthetic_models.py), one GRPO step with the vLLM engine, bf16, LoRA and TIS on; prints
#    rollout tokens/s against standalone vllm.LLM.generate on the same prompt ids (goal: ratio >= 0.9) and the
#    weight-sync seconds;
# 5b. the transformers engine's lean decode step on CUDA (fp32 and bf16 Qwen2 from config): its logits against the
#    model's own forward, and the engine's tokens/s with and without it;
# 6. two GPUs (runs only when torch sees >= 2 devices, and says so when not): the tiny SFT stage and a GRPO round
#    under torchrun with 2 processes on NCCL, DDP and FSDP, against the 1-process run (final loss within 1e-3
#    in fp32), and the per-rank peak memory lines.
# 7. speed at realistic sizes on the GPU: benchmarks/qwen2.py --device cuda --quick (GRPO step with vLLM rollouts
#    against TRL's GRPOTrainer, the transformers engine against generate, SFT against TRL's SFTTrainer), printing
#    the ratios against their goals; GPU_CHECK_BENCH=0 leaves it out.
# 8. long rows at a real vocabulary: benchmarks/long_context.py --device cuda --lengths 8192 (one GRPO update and
#    one SFT step against TRL, peak CUDA memory beside the RSS); GPU_CHECK_LONG=0 leaves it out.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
FAILS=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }

PY=${PYTHON:-python3}
if ! $PY -c "import torch, vllm, training; assert torch.cuda.is_available()" 2>/dev/null; then
  if [ -x .venv-gpu/bin/python ] && .venv-gpu/bin/python -c "import torch, vllm, training" 2>/dev/null; then
    PY=.venv-gpu/bin/python
  else
    echo "installing posttrain[gpu] into .venv-gpu (vllm brings its own CUDA torch) ..."
    $PY -m venv .venv-gpu && PY=.venv-gpu/bin/python
    timeout 420 $PY -m pip install -q -e '.[gpu]' || { fail "install: pip install -e .[gpu]"; exit 1; }
  fi
fi
$PY -c "import torch; assert torch.cuda.is_available(); print('cuda', torch.cuda.get_device_name(0), 'torch', torch.__version__)" \
  && pass "cuda visible" || { fail "cuda not visible to torch"; exit 1; }
$PY -c "import vllm; print('vllm', vllm.__version__)" && pass "vllm imports" || fail "vllm import"

timeout 300 $PY - <<'PYEOF'
import copy, sys, tempfile, traceback
import torch
from training.modeling import models
from training.rollout import make_engine
from training.tasksets.generators import generate

def report(ok, what):
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    return ok

tasks = generate("math", 200, 0, (1, 2)) + generate("extraction", 50, 0, (1, 2))
tok = models.build_tiny_tokenizer([t.prompt for t in tasks] + [t.reference for t in tasks], 512)
torch.manual_seed(0)
model = models.build_tiny_model(models.TinyModelConfig(), tok)
tmp = tempfile.mkdtemp(prefix="gpu-check-")
models.save_checkpoint(model, tok, tmp)
prompts = [t.prompt for t in tasks[:8]]
ok = True
try:
    eng = make_engine("vllm", tmp, tok, gpu_memory_utilization=0.2, max_model_len=128)
    a = eng.generate(prompts, n_samples=4, max_new_tokens=8, temperature=1.0, seed=1)
    ok &= report(len(a) == 8 and all(len(g) == 4 for g in a)
                 and all(len(c.logprobs) == len(c.token_ids) for g in a for c in g), "vllm generate shapes + logprobs")
    g1 = eng.generate(prompts, 1, 8, temperature=0.0)
    hf = make_engine("hf", model.cuda(), tok).generate(prompts, 1, 8, temperature=0.0)
    same = sum(x[0].token_ids == y[0].token_ids for x, y in zip(g1, hf))
    ok &= report(same >= 6, f"vllm greedy matches HF greedy on {same}/8 prompts")
    perturbed = copy.deepcopy(model).cpu()
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    eng.update_weights(perturbed.state_dict())
    g2 = eng.generate(prompts, 1, 8, temperature=0.0)
    ok &= report(any(x[0].token_ids != y[0].token_ids for x, y in zip(g1, g2)), "vllm update_weights(state_dict) changes outputs")
    eng.update_weights(tmp)
    g3 = eng.generate(prompts, 1, 8, temperature=0.0)
    ok &= report([x[0].token_ids for x in g3] == [x[0].token_ids for x in g1], "vllm update_weights(folder) restores outputs")
except Exception:
    traceback.print_exc()
    ok = report(False, "vllm engine")

try:
    from training.rl.config import GRPOConfig
    from training.rl.round import Round
    dev = torch.device("cuda")
    cfg = GRPOConfig(prompts_per_step=8, samples_per_prompt=4, max_new_tokens=8, device="cuda", beta=0.01,
                     dynamic_sampling=False)  # untrained model: all rewards 0; still run the update (KL term)
    policy = copy.deepcopy(model).to(dev).train()
    ref = copy.deepcopy(model).to(dev).eval().requires_grad_(False)
    rnd = Round.build(cfg, 1, policy, tok, ref, tasks, dev)
    m = rnd.step(0)
    finite = all(v == v for v in m.values())
    ok &= report(finite and "train/loss" in m, f"GRPO step on CUDA ({m['step_seconds']:.2f}s, kept {m['groups_kept']:.0f} groups)")
except Exception:
    traceback.print_exc()
    ok = report(False, "GRPO step on CUDA")
sys.exit(0 if ok else 1)
PYEOF
RC=$?
[ $RC -eq 0 ] || FAILS=$((FAILS + 1))

timeout 300 $PY - <<'PYEOF'
import sys, tempfile, time, traceback
from pathlib import Path
import torch
from training.modeling import models
from training.modeling.chat import ChatSettings, PromptFormat
from training.modeling.lora import LoraSettings, apply_lora
from training.modeling.synthetic_models import build_chatml_qwen2
from training.tasksets.generators import generate

def report(ok, what):
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    return ok

ok = True
try:
    from vllm import LLM, SamplingParams, TokensPrompt
    from training.rl.config import GRPOConfig
    from training.rl.round import Round
    tasks = generate("math", 400, 0, (1, 2, 3)) + generate("code", 100, 0, (1, 2))
    folder = build_chatml_qwen2(Path(tempfile.mkdtemp(prefix="gpu-check-qwen2-")) / "qwen2",
                                [t.prompt + " " + t.reference for t in tasks], vocab_size=2000, hidden_size=512,
                                intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                                num_key_value_heads=2, max_position_embeddings=1024)
    dev = torch.device("cuda")
    model, tok = models.load_model(str(folder), dtype=torch.bfloat16)  # frozen LoRA base in bf16
    tok.chat_settings = ChatSettings()
    print(f"qwen2 model: {models.count_parameters(model) / 1e6:.1f}M parameters", flush=True)
    policy = apply_lora(model.to(dev), LoraSettings(enabled=True, r=16, alpha=32))
    cfg = GRPOConfig(prompts_per_step=32, samples_per_prompt=8, max_new_tokens=128, device="cuda", beta=0.01,
                     rollout_engine="vllm", precision="bf16", rollout_correction="tis", dynamic_sampling=False,
                     lora=LoraSettings(enabled=True, r=16, alpha=32), vllm_gpu_memory_utilization=0.25,
                     vllm_max_model_len=1024, micro_batch_size=64)
    rnd = Round.build(cfg, 1, policy, tok, None, tasks, dev)
    m = rnd.step(0)
    finite = all(v == v for v in m.values())
    ok &= report(finite and "train/loss" in m and "train/rollout_mismatch_kl" in m,
                 f"GRPO step, vLLM + bf16 + LoRA + TIS ({m['step_seconds']:.2f}s, mismatch KL "
                 f"{m.get('train/rollout_mismatch_kl', float('nan')):.2e}, "
                 f"weight sync {m.get('train/weight_sync_seconds', float('nan')):.3f}s)")
    print(f"weight-sync seconds: {m.get('train/weight_sync_seconds', float('nan')):.3f}", flush=True)

    prompts = [rnd.prompt_ids(t) for t in tasks[:128]]
    def ours():
        t0 = time.perf_counter()
        groups = rnd.engine.generate(prompts, 8, 128, temperature=1.0, seed=3)
        return sum(len(c.token_ids) for g in groups for c in g) / (time.perf_counter() - t0)
    ref_llm = LLM(model=str(folder), gpu_memory_utilization=0.25, max_model_len=1024, seed=0)
    params = SamplingParams(n=8, max_tokens=128, temperature=1.0, seed=3, stop_token_ids=rnd.fmt.stop_ids)
    def standalone():
        t0 = time.perf_counter()
        outs = ref_llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return sum(len(o.token_ids) for r in outs for o in r.outputs) / (time.perf_counter() - t0)
    ours(); standalone()  # warm-up
    a = max(ours() for _ in range(3))
    b = max(standalone() for _ in range(3))
    print(f"rollout tokens/s: posttrain engine {a:.0f}, standalone vllm.LLM.generate {b:.0f}, ratio {a / b:.2f}",
          flush=True)
    ok &= report(a / b >= 0.9, f"rollout throughput ratio {a / b:.2f} (goal >= 0.9)")
except Exception:
    traceback.print_exc()
    ok = report(False, "pretrained-model path (vLLM + bf16 + LoRA + TIS)")
sys.exit(0 if ok else 1)
PYEOF
RC=$?
[ $RC -eq 0 ] || FAILS=$((FAILS + 1))

# --- 5b. the transformers engine's lean decode step (training/rollout/lean_decode.py) on CUDA, fp32 and bf16 ----
timeout 180 $PY - <<'PYEOF'
import sys, time
import torch, transformers
from types import SimpleNamespace
from training.modeling.kv_cache import cache_kwarg, cache_of
from training.rollout.hf import HFRolloutEngine
from training.rollout.lean_decode import LeanDecoder

ok = True
for dtype, tol in ((torch.float32, 1e-3), (torch.bfloat16, 5e-2)):
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=1000, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to("cuda", dtype).eval()
    ids = torch.randint(3, 1000, (6, 20), device="cuda")
    attn = torch.ones_like(ids)
    attn[0, :5] = 0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    worst, agree = 0.0, []
    with torch.no_grad():
        past = cache_of(model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True))
        lean = LeanDecoder.from_cache(model, past, attn, 16)
        nxt, npos = ids[:, -1], pos[:, -1] + 1
        for _ in range(8):
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], 1)
            ref = model(input_ids=nxt[:, None], attention_mask=attn, position_ids=npos[:, None], use_cache=True,
                        **{cache_kwarg(model): past})
            past, want = cache_of(ref), ref.logits[:, -1].float()
            got = lean.step(nxt, npos).float()
            worst = max(worst, float((got - want).abs().max() / want.abs().max()))
            agree.append(float((got.argmax(-1) == want.argmax(-1)).float().mean()))
            nxt, npos = want.argmax(-1), npos + 1
    good = worst <= tol and sum(agree) / len(agree) >= 0.9
    ok &= good
    print(("PASS" if good else "FAIL") + f" lean decode {dtype}: max |diff|/max|logit| {worst:.2e} (<= {tol:g}), "
          f"argmax agreement {sum(agree) / len(agree):.2f}", flush=True)
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=1, decode=lambda ids, skip_special_tokens=True: "")
    prompts = [list(range(5, 45))] * 4
    for lean_on in (True, False):
        eng = HFRolloutEngine(model, tok, stop_ids=[1], lean=lean_on)
        eng.generate(prompts, 8, 16)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        n = sum(len(c.token_ids) for g in eng.generate(prompts, 8, 128, seed=1) for c in g)
        torch.cuda.synchronize()
        print(f"     engine {dtype} lean={lean_on}: {n / (time.perf_counter() - t0):.0f} tokens/s", flush=True)
sys.exit(0 if ok else 1)
PYEOF
[ $? -eq 0 ] || FAILS=$((FAILS + 1))

# --- 6. two GPUs: SFT and a GRPO round under torchrun (NCCL), DDP and FSDP, against one process -------------
NGPU=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "${NGPU:-0}" -ge 2 ]; then
  TMP2=$(mktemp -d /tmp/gpu-check-2gpu-XXXX)
  export MLFLOW_TRACKING_URI="sqlite:///$TMP2/mlflow.db"
  $PY - "$TMP2" <<'PYEOF' || fail "2-GPU: task set + 1-process SFT"
import sys
from tests.training.conftest import commit_taskset, make_tasks, split_tasks
commit_taskset(f"file://{sys.argv[1]}/base", *split_tasks(make_tasks()))
PYEOF
  SFT='{"max_steps":8,"batch_size":8,"max_seq_len":64,"vocab_size":300,"checkpoint_every":4,"log_every":4,"device":"cuda","precision":"fp32"}'
  RL='{"steps":3,"prompts_per_step":8,"samples_per_prompt":4,"max_new_tokens":8,"checkpoint_every":2,"device":"cuda","precision":"fp32","rollout_engine":"hf","holdout_per_domain":2,"parallel":{"rollout_seeding":"prompt"}}'
  loss() { grep -o '"final_loss": [-0-9.e]*' | tail -1 | awk '{print $2}'; }
  for MODE in one ddp fsdp; do
    cp -r "$TMP2/base" "$TMP2/$MODE"
    if [ $MODE = one ]; then
      LAUNCH="$PY -m training.cli"; SET=""
    else
      LAUNCH="$PY -m torch.distributed.run --standalone --nproc-per-node 2 -m training.cli --"
      SET="--set parallel.strategy=$MODE"
    fi
    timeout 300 $LAUNCH sft --run "file://$TMP2/$MODE" --config "$SFT" $SET > "$TMP2/$MODE-sft.log" 2>&1 \
      && pass "2-GPU: sft ($MODE) final loss $(loss < "$TMP2/$MODE-sft.log")" || fail "2-GPU: sft ($MODE), see $TMP2/$MODE-sft.log"
    timeout 300 $LAUNCH rl-round --round 1 --run "file://$TMP2/$MODE" --config "$RL" $SET > "$TMP2/$MODE-rl.log" 2>&1 \
      && pass "2-GPU: rl-round ($MODE) $(grep -o 'train/loss=[-0-9.e]*' "$TMP2/$MODE-rl.log" | tail -1)" \
      || fail "2-GPU: rl-round ($MODE), see $TMP2/$MODE-rl.log"
    grep -o 'memory/peak_gb_rank[0-9]=[0-9.]*' "$TMP2/$MODE-rl.log" | tail -2 | tr '\n' ' '; echo
  done
  ONE=$(loss < "$TMP2/one-sft.log")
  for MODE in ddp fsdp; do
    TWO=$(loss < "$TMP2/$MODE-sft.log")
    $PY -c "import sys; sys.exit(abs(float('$ONE') - float('$TWO')) > 1e-3)" 2>/dev/null \
      && pass "2-GPU: sft $MODE loss $TWO matches 1 process $ONE (tolerance 1e-3)" \
      || fail "2-GPU: sft $MODE loss '$TWO' vs 1 process '$ONE' (tolerance 1e-3)"
  done
else
  echo "SKIP 2-GPU section: torch sees ${NGPU:-0} CUDA device(s); it runs when two are visible"
fi
# --- 7. speed at realistic sizes on the GPU (benchmarks/qwen2.py): GRPO step against TRL, rollouts, SFT ---------
# Measurements, not pass/fail on their goals: the ratios and which goals hold are printed for the closing note.
# GPU_CHECK_BENCH=0 leaves it out (it takes a few minutes: each side of each comparison starts its own process).
if [ "${GPU_CHECK_BENCH:-1}" != 0 ]; then
  BENCH_LOG=$(mktemp /tmp/gpu-check-bench-XXXX.log)
  if timeout 300 $PY benchmarks/qwen2.py --device cuda --quick --repeats 1 > "$BENCH_LOG" 2>&1; then
    pass "speed benchmark on the GPU ran (benchmarks/qwen2.py --device cuda --quick)"
  else
    fail "speed benchmark on the GPU, see $BENCH_LOG"
  fi
  sed -n '/^summary/,$p' "$BENCH_LOG"
  grep -E "where a step goes|peak RSS" "$BENCH_LOG"
fi
# --- 8. long rows at a real vocabulary on the GPU (benchmarks/long_context.py): ours against TRL, peak CUDA memory ---
# One GRPO update and one SFT step at 8k tokens a row, V = 151,936; each side in its own process. Measurements for
# the closing note (the CPU goals are in docs/results.md). GPU_CHECK_LONG=0 leaves it out.
if [ "${GPU_CHECK_LONG:-1}" != 0 ]; then
  LONG_LOG=$(mktemp /tmp/gpu-check-long-XXXX.log)
  if timeout 420 $PY benchmarks/long_context.py --device cuda --lengths 8192 > "$LONG_LOG" 2>&1; then
    pass "long-context benchmark on the GPU ran (benchmarks/long_context.py --device cuda --lengths 8192)"
  else
    fail "long-context benchmark on the GPU, see $LONG_LOG"
  fi
  grep -E "^\|" "$LONG_LOG"
fi
echo "gpu-check: $(( $(date +%s) - START ))s, $FAILS failure(s)"
[ $FAILS -eq 0 ]
