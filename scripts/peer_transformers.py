# transformers beside augur on one checkpoint (docs/benchmarks.md): writes a
# random-weight Qwen3-8B (the shape of augur's --synthetic qwen3-8b) to DIR
# and times transformers' generate there (eager, greedy, bf16, SDPA); then
#   augur bench DIR --device cuda --prompt 512 --gen 64 --batch 1,32
# on the same checkpoint. Usage (GPU machine): python3 scripts/peer_transformers.py DIR
import os, sys, time, torch, transformers
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from write_checkpoint import write
model, cfg = write("qwen3-8b", sys.argv[1])
g = torch.Generator(device="cuda").manual_seed(1)
for batch in (1, 32):
    ids = torch.randint(0, cfg.vocab_size, (batch, 512), device="cuda", generator=g)
    def gen(n):
        torch.cuda.synchronize(); t0 = time.time()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        torch.cuda.synchronize(); return time.time() - t0
    gen(4)  # warm-up
    t1, t65 = gen(1), gen(65)
    print(f"transformers {transformers.__version__} decode batch {batch}, context 512: "
          f"{batch*64/(t65-t1):.2f} tok/s, {1e3*(t65-t1)/64:.3f} ms/step", flush=True)
