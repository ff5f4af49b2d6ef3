"""The instruction mix of a kernel's loops, read from its SASS without a GPU: each backward branch is a loop, and
its body's instructions are counted by opcode (largest bodies first). What a loop costs per trip is the question
when a kernel is bound by the instructions it issues (ncu: low DRAM throughput, stalls on "wait" and "short
scoreboard"): the counts show where they go before any GPU time is spent.

  nvcc -O3 -gencode arch=compute_90a,code=sm_90a -I. -c cuda/attention_decode.cu -o /tmp/a.o
  cuobjdump -sass -fun '<mangled kernel name>' /tmp/a.o > /tmp/k.sass   (cuobjdump -sass /tmp/a.o lists the names)
  python3 dev/sass_loops.py /tmp/k.sass [loops to show]

cuobjdump comes with the CUDA toolkit (also as the nvidia-cuda-cuobjdump wheel where the toolkit lacks it). A
loop with a rarely taken branch inside counts that branch's instructions too, and the return from an out-of-line
slow path (a division's) is a backward branch as well, whose span may cover most of the kernel: read the body
(the addresses are printed) to tell them apart."""
import collections, re, sys

ins = []  # (address, instruction text)
for line in open(sys.argv[1]):
    m = re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', line)
    if m:
        ins.append((int(m.group(1), 16), m.group(2)))
index = {a: i for i, (a, _) in enumerate(ins)}
loops = []  # (first, last) instruction index of each body
for i, (a, text) in enumerate(ins):
    m = re.search(r'BRA(?:\.\w+)*\s+.*?0x([0-9a-f]+)', text)
    if m and int(m.group(1), 16) < a and int(m.group(1), 16) in index:
        loops.append((index[int(m.group(1), 16)], i))
show = int(sys.argv[2]) if len(sys.argv) > 2 else 6
print(f"{len(ins)} instructions")
for s, e in sorted(loops, key=lambda l: l[0] - l[1])[:show]:
    ops = collections.Counter()
    for _, text in ins[s:e + 1]:
        words = text.split()
        op = words[1] if words[0].startswith('@') else words[0]  # past a predicate
        ops[op.split('.')[0]] += 1
    mix = ', '.join(f'{k} {v}' for k, v in ops.most_common(16))
    print(f"loop {ins[s][0]:#x}..{ins[e][0]:#x}: {e - s + 1} instructions: {mix}")
