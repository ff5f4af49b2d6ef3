#!/usr/bin/env python3
# test/fuzz/make_corpus.py: writes the fuzz targets' seed corpora, test/fuzz/corpus/<target>/:
# small valid inputs made from the test fixtures (seed-*), and the bad inputs of each defect
# fixed (regress-*; test/test_inputs.c asserts each one's error). Python's standard library only;
# deterministic. The corpora are committed: run this again only to change them. (The minimized
# inputs of what the fuzzers found, found-*, are committed as they were found.)
#
#   python3 test/fuzz/make_corpus.py        (from the repository root)
#
# An input is its files one after another, separated by the line "--8<--" (test/fuzz/fuzz.h).
import json
import os
import random
import struct

ROOT = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(ROOT, "..", "fixtures")
OUT = os.path.join(ROOT, "corpus")
SEP = b"\n--8<--\n"
rng = random.Random(22)


def put(target, name, *parts):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    data = SEP.join(p if isinstance(p, bytes) else p.encode() for p in parts)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors -------------------------------------------------------------------------------

def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


def bf16(vals):
    return b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:] for v in vals)


def f16(vals):
    return struct.pack("<%de" % len(vals), *vals)


def safetensors(tensors, metadata=None, header_pad_to=8, raw_header=None):
    """tensors: [(name, dtype, shape, data bytes)] laid out in order; header padded with spaces to
    a multiple of header_pad_to (1: none); raw_header replaces the header JSON as given."""
    hdr, off, blob = {}, 0, b""
    if metadata is not None:
        hdr["__metadata__"] = metadata
    for name, dt, shape, data in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blob += data
    h = raw_header if raw_header is not None else json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % header_pad_to)
    return struct.pack("<Q", len(h)) + h + blob


def randn(n, s=0.5):
    return [rng.gauss(0, s) for _ in range(n)]


def st_seeds():
    t = [("a", "F32", [2, 3], f32(randn(6))), ("b", "BF16", [4], bf16(randn(4))), ("c", "F16", [2, 2], f16(randn(4))),
         ("d", "F8_E4M3", [8], bytes(range(0x30, 0x38))), ("e", "F8_E5M2", [2], b"\x3c\xbc"), ("f", "I32", [3], struct.pack("<3i", 1, -2, 3)),
         ("g", "I64", [1], struct.pack("<q", 7)), ("h", "BOOL", [2], b"\x00\x01"), ("s", "F64", [], struct.pack("<d", 2.5)),
         ("z", "F32", [0, 4], b"")]
    put("safetensors", "seed-dtypes", safetensors(t, {"format": "pt"}))
    idx = {"metadata": {"total_size": 24}, "weight_map": {"a": "model.safetensors", "b": "model.safetensors"}}
    put("safetensors", "seed-index", safetensors(t[:2]), json.dumps(idx))
    # data_offsets past 2^64 (1e20) and infinite (1e400): compared before any conversion
    for name, end in (("regress-offsets-1e20", "1e20"), ("regress-offsets-inf", "1e400")):
        h = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,' + end.encode() + b']}}'
        put("safetensors", name, safetensors([], raw_header=h) + b"\0" * 4)
    # an element count that wraps to 0 in 64 bits: 2^32 x 2^32
    h = b'{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}'
    put("safetensors", "regress-numel-overflow", safetensors([], raw_header=h))
    # data at an odd address: a header of 57 bytes, read correctly through a copy
    put("safetensors", "regress-misaligned", safetensors([("w", "F32", [3], f32([1.5, -2.0, 0.25]))], header_pad_to=1,
                                                         raw_header=b'{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}  '))
    # a name with a newline in an error: still one line
    h = b'{"a\\nb":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}'
    put("safetensors", "regress-name-newline", safetensors([], raw_header=h) + b"\0")


# ---- checkpoints (config.json + model.safetensors) -------------------------------------------------

def tiny_model(arch, dtype="F32", fp8=False, V=16, C=8, FF=12, L=1, NH=2, KVH=1, HD=4, **extra):
    cfg = {"model_type": arch, "vocab_size": V, "hidden_size": C, "intermediate_size": FF, "num_hidden_layers": L,
           "num_attention_heads": NH, "num_key_value_heads": KVH, "head_dim": HD, "max_position_embeddings": 32,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": arch == "qwen3", "hidden_act": "silu",
           "bos_token_id": 1, "eos_token_id": [2, 3]}
    cfg.update(extra)
    enc = {"F32": f32, "BF16": bf16, "F16": f16}[dtype]
    ts = [("model.embed_tokens.weight", dtype, [V, C], enc(randn(V * C))), ("model.norm.weight", dtype, [C], enc([1.0] * C))]
    if arch != "qwen3":
        ts.append(("lm_head.weight", dtype, [V, C], enc(randn(V * C))))
    shapes = {"q_proj": (NH * HD, C), "k_proj": (KVH * HD, C), "v_proj": (KVH * HD, C), "o_proj": (C, NH * HD),
              "gate_proj": (FF, C), "up_proj": (FF, C), "down_proj": (C, FF)}
    for l in range(L):
        p = "model.layers.%d." % l
        ts += [(p + "input_layernorm.weight", dtype, [C], enc([1.0] * C)), (p + "post_attention_layernorm.weight", dtype, [C], enc([1.0] * C))]
        if arch == "qwen3":
            ts += [(p + "self_attn.q_norm.weight", dtype, [HD], enc([1.0] * HD)), (p + "self_attn.k_norm.weight", dtype, [HD], enc([1.0] * HD))]
        for proj, (r, c) in shapes.items():
            name = p + ("self_attn." if proj in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp.") + proj
            if arch == "qwen2" and proj in ("q_proj", "k_proj", "v_proj"):
                ts.append((name + ".bias", dtype, [r], enc(randn(r, 0.1))))
            if fp8:  # E4M3 codes of modest values, one scale per 128x128 block
                codes = bytes(rng.choice(list(range(0x28, 0x40)) + list(range(0xA8, 0xC0))) for _ in range(r * c))
                ts += [(name + ".weight", "F8_E4M3", [r, c], codes), (name + ".weight_scale_inv", "F32", [1, 1], f32([0.05]))]
            else:
                ts.append((name + ".weight", dtype, [r, c], enc(randn(r * c, 1.0 / c ** 0.5))))
    return cfg, safetensors(ts, {"format": "pt"})


def model_seeds():
    llama_rope = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 16}}
    cases = [("seed-qwen3-f32", tiny_model("qwen3"), None), ("seed-qwen2-bf16", tiny_model("qwen2", "BF16"), b"\x03"),
             ("seed-llama3-f16", tiny_model("llama", "F16", **llama_rope), b"\x01"), ("seed-qwen3-fp8", tiny_model("qwen3", fp8=True), b"\x00"),
             ("seed-qwen3-fp8-row", tiny_model("qwen3", fp8=True), b"\x01")]
    for name, (cfg, st), gran in cases:
        put("model", name, json.dumps(cfg, indent=1), st, *([gran] if gran else []))
    cfg, st = tiny_model("qwen3")
    # each field out of its bounds, and a vocabulary in bounds that the weights contradict (the
    # check before any allocation: 10,000,000 x 8 floats are never allocated)
    bad = {"regress-vocab-huge": {"vocab_size": 953326694}, "regress-vocab-mismatch": {"vocab_size": 10000000},
           "regress-head-dim-overflow": {"head_dim": 536870912, "num_attention_heads": 4},
           "regress-heads-overflow": {"num_attention_heads": 1 << 20, "num_key_value_heads": 1},
           "regress-max-pos-negative": {"max_position_embeddings": -1}, "regress-rope-theta-huge": {"rope_theta": 1e300},
           "regress-eps-negative": {"rms_norm_eps": -1e-6}, "regress-eos-out-of-range": {"eos_token_id": [2, 16]},
           "regress-layers-fraction": {"num_hidden_layers": 1.5}}
    for name, change in bad.items():
        c = dict(cfg, **change)
        put("model", name, json.dumps(c), st)
    c = dict(cfg, rope_scaling={"rope_type": "llama3", "factor": 0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 16})
    put("model", "regress-rope-factor-zero", json.dumps(c), st)


# ---- tokenizers ------------------------------------------------------------------------------------

def read(rel):
    with open(os.path.join(FIX, rel), "rb") as f:
        return f.read()


def bl(text):
    """GPT-2's byte-level form of text (what vocabulary strings are written in)"""
    keep = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    m, n = {}, 0
    for b in range(256):
        m[b] = chr(b) if b in keep else chr(256 + n)
        n += b not in keep
    return "".join(m[b] for b in text.encode())


def trim_tokenizer(j, merges, added, chars="abcdefghilnorstw0123456789 ,.!'\n"):
    """a small vocabulary of the same kind, so that the target runs fast: the one-character tokens
    of `chars`, the first `merges` merges among them, the first `added` added tokens; ids renumbered
    from 0 (a byte outside the vocabulary is dropped, as tokenizers does without an unk token)"""
    vocab, singles = j["model"]["vocab"], set(bl(chars))
    keep, ms = {s for s in vocab if len(s) == 1 and s in singles}, []
    for m in j["model"]["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in keep and b in keep and a + b in vocab and len(ms) < merges:
            ms.append(m)
            keep.add(a + b)
    order = sorted(keep, key=lambda s: vocab[s])
    j["model"]["vocab"] = {s: i for i, s in enumerate(order)}
    j["model"]["merges"] = ms
    j["added_tokens"] = [dict(a, id=len(order) + k) for k, a in enumerate(j["added_tokens"][:added])]
    if j.get("post_processor"):  # TemplateProcessing's ids follow the renumbering
        ids = {a["content"]: a["id"] for a in j["added_tokens"]}
        for p in [j["post_processor"]] + j["post_processor"].get("processors", []):
            for name, tok in p.get("special_tokens", {}).items():
                tok["ids"] = [ids.get(name, 0)]
    return j


TEXT = "Hello world! 你好, naïve café 123 <|im_end|> <s>word</s>\n\tdon't"
SP_TEXT = " <bos>▁▁ <0x41>  😀 [INST] per cent 12 <end_of_turn>"


def trim_sp(j, merges, added, bytes_too):
    """trim_tokenizer for a SentencePiece-style file: the special tokens, the one-character tokens of
    a few characters and U+2581, some <0xNN> tokens (all of them with bytes_too), the first `merges`
    merges among them; the added tokens keep their vocabulary ids"""
    vocab, singles = j["model"]["vocab"], set("abcdefghilnorstw0123456789 ,.!'\n\u2581")
    keep = {a["content"] for a in j["added_tokens"][:added] if a["content"] in vocab}
    keep |= {s for s in vocab if (len(s) == 1 and s in singles) or (s.startswith("<0x") and (bytes_too or s < "<0x80>"))}
    ms = []
    for m in j["model"]["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in keep and b in keep and a + b in vocab and len(ms) < merges:
            ms.append(m)
            keep.add(a + b)
    order = sorted(keep, key=lambda s: vocab[s])
    j["model"]["vocab"] = {s: i for i, s in enumerate(order)}
    j["model"]["merges"] = ms
    ids = j["model"]["vocab"]
    j["added_tokens"] = [dict(a, id=ids.get(a["content"], len(order) + k)) for k, a in enumerate(j["added_tokens"][:added])]
    if j.get("post_processor"):
        names = {a["content"]: a["id"] for a in j["added_tokens"]}
        for name, tok in j["post_processor"].get("special_tokens", {}).items():
            tok["ids"] = [names.get(name, 0)]
    return j


def tokenizer_seeds():
    gpt2 = json.dumps(trim_tokenizer(json.loads(read("tokenizer/gpt2/tokenizer.json")), 20, 7), ensure_ascii=False)
    put("tokenizer", "seed-gpt2", gpt2, "{}", "{}", TEXT)
    q = trim_tokenizer(json.loads(read("tokenizer/qwen2/tokenizer.json")), 20, 6)
    qcfg = json.loads(read("tokenizer/qwen2/tokenizer_config.json"))
    qcfg = json.dumps({k: qcfg[k] for k in ("chat_template", "eos_token", "pad_token", "bos_token") if k in qcfg}, ensure_ascii=False)
    put("tokenizer", "seed-qwen2-chat", json.dumps(q, ensure_ascii=False), qcfg, read("tokenizer/qwen2/generation_config.json"), TEXT)
    ll = trim_tokenizer(json.loads(read("tokenizer/llama3/tokenizer.json")), 20, 12)
    lcfg = json.loads(read("tokenizer/llama3/tokenizer_config.json"))
    lcfg = {k: lcfg[k] for k in ("chat_template", "eos_token", "pad_token", "bos_token") if k in lcfg}
    put("tokenizer", "seed-llama3-chat", json.dumps(ll, ensure_ascii=False), json.dumps(lcfg), read("tokenizer/llama3/generation_config.json"), TEXT)
    # SentencePiece-style (characters as symbols, <0xNN> byte fallback, U+2581) and Digits + ByteLevel
    for kind, nadd in (("gemma", 8), ("mistral", 5), ("sp_odd", 4)):
        j = trim_sp(json.loads(read("tokenizer/%s/tokenizer.json" % kind)), 20, nadd, kind != "sp_odd")
        cfg = read("tokenizer/%s/tokenizer_config.json" % kind)
        put("tokenizer", "seed-" + kind.replace("_", "-"), json.dumps(j, ensure_ascii=False), cfg, "{}", TEXT + SP_TEXT)
    sm = trim_tokenizer(json.loads(read("tokenizer/smollm/tokenizer.json")), 20, 3)
    put("tokenizer", "seed-smollm", json.dumps(sm, ensure_ascii=False), read("tokenizer/smollm/tokenizer_config.json"), "{}", TEXT)
    # an added token whose content is the lone byte 0xBD (not UTF-8): encoding "你好" (E4 BD A0
    # E5 A5 BD) used to hang without NFC and read wild memory with it; the file is refused now
    for name, base in (("regress-added-invalid-utf8", json.loads(gpt2)), ("regress-added-invalid-utf8-nfc", q)):
        j = json.loads(json.dumps(base))
        j["added_tokens"].append({"id": 4000, "content": "@@BD@@", "single_word": False, "lstrip": False, "rstrip": True,
                                  "normalized": False, "special": False})
        text = json.dumps(j, ensure_ascii=False).encode().replace(b"@@BD@@", b"\xbd")
        put("tokenizer", name, text, b"\xe4\xbd\xa0\xe5\xa5\xbd")


# ---- JSONL data ----------------------------------------------------------------------------------------

def jsonl_seeds():
    lines = ['{"prompt": "What is 17+25?", "answer": "42"}', '{"question": "Natalia sold 48 clips... How many?", "answer": "She sold 48/2 = 24.\\n#### 72"}',
             '', '{"prompt": "Capital of France?", "answer": "Paris"}', '{"prompt": "Big", "answer": 1234567.5}',
             '{"prompt": "Cost?", "answer": "$1,234"}', '  {"prompt": "p\\u00e9", "answer": "-3"}  ']
    put("jsonl", "seed-mixed", "\n".join(lines) + "\n", "Let me think. <answer>42</answer> #### 72 \\boxed{7}")
    put("jsonl", "seed-countdown", '{"prompt": "3,5,7->22:", "answer": "3*5+7"}\n', "(3+5)*7/8*22-7")
    # JSON a C string cannot hold, or leaves undefined: refused, never read as something else
    put("jsonl", "regress-duplicate-key", '{"prompt": "1+1=", "prompt": "2+2=", "answer": "4"}\n', "4")
    put("jsonl", "regress-nul-escape", '{"prompt": "1+1=\\u0000x", "answer": "2"}\n', "2")
    # ./train_sft's and ./train_dpo's formats (the same file goes through their readers too)
    pref = ['{"prompt": "17+25=", "chosen": "42", "rejected": "32"}', '{"prompt": "17+25=", "completion": "42"}',
            '{"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], '
            '"chosen": [{"role": "assistant", "content": "c"}], "rejected": [{"role": "assistant", "content": "r"}]}',
            '{"chosen": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "c"}], '
            '"rejected": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "r"}]}',
            '{"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}']
    put("jsonl", "seed-preference", "\n".join(pref) + "\n", "42")


# ---- PEFT adapters and checkpoints, for the model of fuzz_peft.c / fuzz_resume.c ----------------------
# (qwen3 shape: hidden 64, intermediate 160, 2 layers, q 4 x 32, k and v 2 x 32)

OUTS = {"q_proj": 128, "k_proj": 64, "v_proj": 64, "o_proj": 64, "gate_proj": 160, "up_proj": 160, "down_proj": 64}
INS = {"q_proj": 64, "k_proj": 64, "v_proj": 64, "o_proj": 128, "gate_proj": 64, "up_proj": 64, "down_proj": 160}


def adapter(r, targets, dtype="F32"):
    enc = {"F32": f32, "BF16": bf16}[dtype]
    ts = []
    for l in range(2):
        for t in targets:
            parent = "mlp" if t in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            p = "base_model.model.model.layers.%d.%s.%s." % (l, parent, t)
            ts += [(p + "lora_A.weight", dtype, [r, INS[t]], enc(randn(r * INS[t], 0.1))), (p + "lora_B.weight", dtype, [OUTS[t], r], enc(randn(OUTS[t] * r, 0.1)))]
    return safetensors(ts, {"format": "pt"})


def peft_seeds():
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 1, "lora_alpha": 2, "lora_dropout": 0.0, "bias": "none",
           "target_modules": ["q_proj", "v_proj"], "use_rslora": False, "use_dora": False, "fan_in_fan_out": False}
    put("peft", "seed-r1-qv", json.dumps(cfg, indent=1), adapter(1, ["q_proj", "v_proj"]))
    allc = dict(cfg, r=2, lora_alpha=4, target_modules="all-linear")
    put("peft", "seed-r2-all-bf16", json.dumps(allc), adapter(2, list(OUTS), "BF16"))
    put("peft", "regress-r-fraction", json.dumps(dict(cfg, r=4.9)), adapter(4, ["q_proj", "v_proj"]))
    put("peft", "regress-alpha-huge", json.dumps(dict(cfg, lora_alpha=1e300)), adapter(1, ["q_proj", "v_proj"]))
    # r in bounds but far larger than the tensors: refused by the file's size before anything is allocated
    put("peft", "regress-r-unbacked", json.dumps(dict(cfg, r=65536)), adapter(1, ["q_proj", "v_proj"]))
    # target_modules as PEFT reads it: a string is a regular expression matched against the whole name
    put("peft", "seed-r1-qv-regex", json.dumps(dict(cfg, target_modules=r"model\.layers\.\d+\.self_attn\.[qv]_proj")),
        adapter(1, ["q_proj", "v_proj"]))
    # a tensor of a module target_modules does not select: refused, not ignored
    put("peft", "regress-tensor-unselected", json.dumps(dict(cfg, target_modules=["q_proj"])), adapter(1, ["q_proj", "v_proj"]))


RUN = {"model": "builtin-tiny", "data": "arithmetic", "lora_r": 2, "lora_alpha": 4}  # fuzz_resume.c's


def optimizer(step, n=1280):
    ts = [(nm, "F32", [n], f32(randn(n, 0.01) if nm != "adam_v" else [abs(x) for x in randn(n, 1e-4)])) for nm in ("params", "adam_m", "adam_v")]
    return safetensors(ts, {"step": str(step), "r": "2"})


def resume_seeds():
    put("resume", "seed-step3", json.dumps({"global_step": 3, "run": RUN}, indent=2), optimizer(3))
    put("resume", "seed-step3-iter2", json.dumps({"global_step": 3, "run": RUN}), optimizer(6))
    put("resume", "regress-step-negative", json.dumps({"global_step": 3, "run": RUN}), optimizer(-1))
    put("resume", "regress-no-run", json.dumps({"global_step": 3}), optimizer(3))
    put("resume", "regress-step-fraction", json.dumps({"global_step": 3.5, "run": RUN}), optimizer(3))


if __name__ == "__main__":  # (the found-* inputs the fuzzers found are files of their own: kept)
    st_seeds()
    model_seeds()
    tokenizer_seeds()
    jsonl_seeds()
    peft_seeds()
    resume_seeds()
    for t in sorted(os.listdir(OUT)):
        files = sorted(os.listdir(os.path.join(OUT, t)))
        print("%-12s %2d inputs, %6d bytes" % (t, len(files), sum(os.path.getsize(os.path.join(OUT, t, f)) for f in files)))
