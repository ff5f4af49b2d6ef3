#!/usr/bin/env python3
# dev/make_tokenizer_fixtures.py: the truth for tokenizer.c, made with Hugging Face
# `tokenizers` (and `transformers` for the chat templates).
#
#   python3 dev/make_tokenizer_fixtures.py            # test/fixtures/tokenizer/ (committed)
#   python3 dev/make_tokenizer_fixtures.py --tables   # also regenerate tokenizer_unicode.h
#   python3 dev/make_tokenizer_fixtures.py --bench    # build/tokenizer_bench/: a 151k-vocab
#                                                     # tokenizer.json + 1 MB of text + HF's ids
#
# We cannot download the real Qwen2/Llama 3 tokenizers here, so we train byte-level BPEs
# with exactly their pipeline (normalizer, Split regex + ByteLevel pre-tokenizer, BPE
# options, added tokens, post-processor, decoder) on a small multilingual corpus written
# below, and save them the way the real checkpoints ship them:
#   qwen2/   Qwen2.5/Qwen3-style: NFC, \p{N} single digits, merges as "a b" strings,
#            ChatML added tokens (special and not), Qwen2.5 chat template (default system)
#   llama3/  Llama-3-style: no normalizer, \p{N}{1,3}, ignore_merges, merges as ["a","b"]
#            pairs, 256 special tokens, TemplateProcessing that prepends <|begin_of_text|>
#   gpt2/    a small odd one: ByteLevel(use_regex, add_prefix_space), added tokens with
#            lstrip/rstrip/single_word/normalized, Split behaviours other than Isolated:
#            the rarely used branches of tokenizer.c get a truth too.
# Each directory holds tokenizer.json, tokenizer_config.json, generation_config.json and
# cases.json: a few hundred strings (hex of the raw bytes, so invalid UTF-8 can be stored)
# with HF's ids (with and without special tokens), HF's decode, and chat prompts rendered by
# transformers' apply_chat_template with add_generation_prompt=True.
# Invalid UTF-8 input: HF only takes valid strings; we define encode(bytes) as HF's encode
# of bytes.decode("utf-8", "replace") (maximal-subpart U+FFFD substitution, also what Rust's
# from_utf8_lossy does), and the fixtures hold exactly that.
import argparse
import json
import os
import random
import re
import sys
import time
import unicodedata

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FIX = os.path.join(ROOT, "test", "fixtures", "tokenizer")

QWEN_RE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA_RE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# ----------------------------------------------------------------------------
# the corpus: hand-written lines in many scripts, code, numbers and odd whitespace,
# then varied programmatically (numbers, spacing) up to ~100 KB.

CORPUS_LINES = r"""
The quick brown fox jumps over the lazy dog. It's 5 o'clock and we'll be late; they're sure I'd forgotten.
Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?
Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?
Let's think step by step. 48 / 2 = 24 clips in May, so 48 + 24 = 72 clips in total. The answer is 72.
Using the numbers [3, 7, 25, 50], create an equation that equals 100. <answer> (50 - 25) * 7 - 75 </answer>
I DON'T KNOW WHY HE'S SHOUTING, BUT WE'VE HEARD IT'S FINE. You're right, isn't it? Rock 'n' roll!
Le cœur a ses raisons que la raison ne connaît point. Où est la bibliothèque ? Il fait très beau à Paris en été.
Ça coûte 3,50 € — c'est déjà ça. L'élève a reçu « une médaille » pour son français très soigné.
Über den Wolken muss die Freiheit wohl grenzenlos sein. Die Straße ist naß; Grüße aus Köln und Düsseldorf!
El niño comió paella en Valencia. ¿Dónde está el baño? ¡Qué día tan bonito! Mañana será otro día.
A ação do coração não tem explicação. São Paulo é a maior cidade do Brasil; não há dúvida.
Zażółć gęślą jaźń. Łódź i Kraków to piękne miasta. Dziękuję bardzo za pomoc!
Tiếng Việt có nhiều dấu: ă â đ ê ô ơ ư, và các thanh điệu huyền, hỏi, ngã, sắc, nặng. Xin chào thế giới!
Türkçe öğrenmek çok güzel; ılık süt içtim. İstanbul'da yaşıyorum ve Şişli'de çalışıyorum.
Съешь же ещё этих мягких французских булок, да выпей чаю. Москва — столица России.
Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε! Η Αθήνα είναι όμορφη.
مرحبا بالعالم. اللغة العربية جميلة جدا، وهي تكتب من اليمين إلى اليسار. العدد ١٢٣٤٥.
שלום עולם. עברית היא שפה שמית. תודה רבה!
नमस्ते दुनिया। हिन्दी भाषा बहुत सुंदर है। मैं भारत से हूँ और मुझे गणित पसंद है।
你好，世界！今天天气很好，我们去公园散步吧。机器学习和深度学习是人工智能的重要分支。
中华人民共和国成立于1949年。北京是中国的首都，上海是最大的城市。请问这个多少钱？一百二十块。
こんにちは世界。日本語の文章にはひらがな、カタカナ、漢字が混ざっています。東京タワーは333メートルです。
안녕하세요 세계! 한국어는 한글로 씁니다. 서울은 대한민국의 수도입니다. 감사합니다.
สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ ขอบคุณครับ
Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ 🔥🔥🔥 🤖 ✅ ❌ ⭐️ 🎉 — done! 🙂
Math: ∀x ∈ ℝ, x² ≥ 0; ∑_{i=1}^{n} i = n(n+1)/2; √2 ≈ 1.41421356; π ≈ 3.14159265358979; ∞ ≠ −∞; ½ + ¼ = ¾.
Phone: +1 (555) 123-4567, ZIP 94103, date 2024-07-26T12:34:56Z, IPv4 192.168.0.1, version v1.2.3-rc.4.
Big numbers: 1234567890123456789012345678901234567890 and 3.141592653589793238462643383279 and 1,000,000.00 and 0x7fffffff.
def fib(n):
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)
for (int i = 0; i < n; i++) {
	sum += a[i] * b[i];  // dot product
}
#include <stdio.h>
int main(int argc, char **argv) { printf("hello, world\n"); return 0; }
{"name": "fp8-grpo", "version": "0.1.0", "tags": ["rl", "lora", "fp8"], "lr": 1e-5, "ok": true, "none": null}
<html><body><p class="x">Hello &amp; welcome</p></body></html>
SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;
$ git commit -m "fix: off-by-one in merges" && make test   # all green
https://example.com/path/to/page?query=1&lang=en#section-2 and mailto:someone@example.org
- item one
- item two
  - nested item with    four spaces
1. First\t2. Second\t3. Third
Line with trailing spaces    
Windows line\r
    indented by four
		indented by two tabs
Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua.
She said: "I'm not sure—maybe." He replied, 'Well, it'll do.' They'd've gone if they could've.
Prices: $3.99, €4,50, £2.75, ¥1000, ₹250, ₿0.001; discounts of 15% off; 24/7 support.
Temperatures range from -40°C to +50°C (−40°F to 122°F).
Fullwidth: ＡＢＣ１２３ and halfwidth ｶﾀｶﾅ and compatibility ﬁ ﬂ ligatures; Roman Ⅻ; circled ①②③.
Combining: e\u0301 vs é; Å vs Å; ﬃ; ǅ; ẛ̣; Ḍ̇; 한 vs 한.
Question: If a train travels 60 km in 45 minutes, what is its average speed in km/h? Answer: 80 km/h.
Q: What is 17 * 23? A: 17 * 23 = 391.
Q: Solve 2x + 3 = 11. A: 2x = 8, so x = 4.
Write a function that returns the nth prime number. Make sure it's efficient for n up to 10^6.
"""

# characters whose normalization matters; the corpus gets them decomposed here and there
# (NFC fixes them for Qwen; Llama sees the raw bytes)
ACCENTED = "éèêëáàâäãåçíìîïóòôöõúùûüñýÿœæøđğışŞİÉÈÊÁÀÂÄÃÅÇÍÓÔÖÚÜÑ"


def corpus_lines():
    """The lines above with their \\uXXXX, \\t and \\r escapes turned into the characters."""
    out = []
    for l in CORPUS_LINES.strip("\n").split("\n"):
        l = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), l)
        out.append(l.replace("\\t", "\t").replace("\\r", "\r"))
    return out


def build_corpus(seed=1234, target=100_000):
    rng = random.Random(seed)
    lines = corpus_lines()
    out = []
    size = 0
    while size < target:
        l = rng.choice(lines)
        r = rng.random()
        if r < 0.15:  # fresh numbers
            l = "".join(str(rng.randint(0, 10 ** rng.randint(1, 9))) if ch.isdigit() and rng.random() < 0.5 else ch for ch in l)
        elif r < 0.25:  # decomposed accents
            l = unicodedata.normalize("NFD", l)
        elif r < 0.32:  # odd spacing
            l = l.replace(" ", " " * rng.randint(1, 4))
        elif r < 0.36:
            l = l.upper()
        elif r < 0.40:
            l = "\t" * rng.randint(1, 2) + l
        end = rng.choice(["\n", "\n", "\n", "\n\n", "\r\n", "  \n", "\n\n\n"])
        out.append(l + end)
        size += len(l.encode("utf-8")) + len(end)
    return "".join(out)


# ----------------------------------------------------------------------------
# tokenizers with the real ones' structure

QWEN_ADDED = [  # Qwen2.5 + Qwen3 added tokens, with the real "special" flags
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]


def llama_added():
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
             "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|reserved_special_token_4|>", "<|eot_id|>"]
    names += ["<|reserved_special_token_%d|>" % i for i in range(5, 251)]
    assert len(names) == 256
    return [(n, True) for n in names]


def train(corpus, regex, nfc, vocab_size, added, gpt2=False):
    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    if gpt2:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator([corpus[i:i + 4096] for i in range(0, len(corpus), 4096)], trainer=trainer)
    tok.add_tokens([AddedToken(c, special=s, normalized=False) for c, s in added])
    return tok


def bytes_to_unicode():
    """GPT-2's byte -> printable character map that ByteLevel uses."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


UNREACHABLE = []  # byte-level strings of the words add_unreachable_words put in


def add_unreachable_words(j, tok, corpus, n=40):
    """Llama 3's vocabulary came from tiktoken, where a whole pre-token found in the vocabulary
    is one token however the merges would split it (hence ignore_merges: true). A trained BPE
    rarely has such entries, so add some: whole words that the merges split, appended to the
    vocabulary without merges. Added tokens move up to stay after the vocabulary."""
    b2u = bytes_to_unicode()
    vocab = j["model"]["vocab"]
    counts = {}
    for w in re.findall(r" ?[A-Za-zÀ-ÿ]{4,}", corpus):
        counts[w] = counts.get(w, 0) + 1
    words = []
    for w, _ in sorted(counts.items(), key=lambda x: (-x[1], x[0])):
        bl = "".join(b2u[b] for b in w.encode("utf-8"))
        if bl not in vocab and len(tok.encode(w, add_special_tokens=False).ids) >= 2:
            words.append(bl)
        if len(words) == n:
            break
    nid = len(vocab)
    UNREACHABLE.extend(words)
    for bl in words:
        vocab[bl] = nid
        nid += 1
    for t in j["added_tokens"]:
        t["id"] += len(words)
    return len(words)


def finish_json(tok, kind, corpus=""):
    """Make the saved JSON look like the real file: BPE options, post-processor, merge form."""
    j = json.loads(tok.to_str())
    m = j["model"]
    if kind == "qwen2":
        m.update(dropout=None, unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                 fuse_unk=False, byte_fallback=False, ignore_merges=False)
        j["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=False, trim_offsets=False, use_regex=False)
        j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
        j["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
        # Qwen2's file (saved by tokenizers < 0.20) has merges as "a b" strings
        m["merges"] = [a + " " + b if isinstance(a, str) else a for a, b in
                       [(x[0], x[1]) if isinstance(x, list) else (x, None) for x in m["merges"]]]
        assert all(isinstance(x, str) and x.count(" ") == 1 for x in m["merges"])
    elif kind == "llama3":
        m.update(dropout=None, unk_token=None, continuing_subword_prefix=None, end_of_word_suffix=None,
                 fuse_unk=False, byte_fallback=False, ignore_merges=True)
        print(f"  llama3: added {add_unreachable_words(j, tok, corpus)} whole words to the vocabulary without merges")
        j["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=False, trim_offsets=True, use_regex=False)
        bos = [t for t in j["added_tokens"] if t["content"] == "<|begin_of_text|>"][0]
        j["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos["id"]], "tokens": ["<|begin_of_text|>"]}}}]}
        j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        m["merges"] = [x if isinstance(x, list) else x.split(" ") for x in m["merges"]]
    elif kind == "gpt2":
        # odd on purpose: NFC, a Split(String) with MergedWithPrevious before ByteLevel(use_regex,
        # add_prefix_space), added tokens with every option, a template with a suffix token
        j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}]}
        j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": "::"}, "behavior": "MergedWithPrevious", "invert": False},
            {"type": "Split", "pattern": {"Regex": "\\|+"}, "behavior": "Removed", "invert": False},
            {"type": "Split", "pattern": {"Regex": "#"}, "behavior": "MergedWithNext", "invert": False},
            {"type": "Split", "pattern": {"Regex": "~+"}, "behavior": "Contiguous", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
        m.update(ignore_merges=False)
        m["merges"] = [x if isinstance(x, list) else x.split(" ") for x in m["merges"]]
        nid = max(t["id"] for t in j["added_tokens"]) + 1
        extra = [("<mask>", dict(lstrip=True, rstrip=False, single_word=False, normalized=False, special=True)),
                 ("[R]", dict(lstrip=False, rstrip=True, single_word=False, normalized=False, special=True)),
                 ("word", dict(lstrip=False, rstrip=False, single_word=True, normalized=False, special=False)),
                 ("café", dict(lstrip=False, rstrip=False, single_word=False, normalized=True, special=False)),
                 ("<both>", dict(lstrip=True, rstrip=True, single_word=False, normalized=False, special=False))]
        for content, opt in extra:
            j["added_tokens"].append(dict(id=nid, content=content, **opt))
            nid += 1
        s, e = "<s>", "</s>"
        ids = {t["content"]: t["id"] for t in j["added_tokens"]}
        j["post_processor"] = {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": s, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                          {"SpecialToken": {"id": e, "type_id": 0}}],
                               "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {s: {"id": s, "ids": [ids[s]], "tokens": [s]},
                                                  e: {"id": e, "ids": [ids[e]], "tokens": [e]}}}
    return j


# ----------------------------------------------------------------------------
# chat templates, like the real tokenizer_config.json's

QWEN25_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n        {{- '<|im_start|>user\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n        {{- '\\n</tool_response><|im_end|>\\n' }}\n"
    "    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n")

# Qwen2 (the first one): the default system prompt in a Jinja string with a real newline
QWEN2_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                  "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
                  "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# Qwen3-like: no default system prompt; thinking on unless enable_thinking=false
QWEN3_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}\n    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n{%- endif %}\n"
    "{%- for message in messages %}\n    {%- if message.role == \"user\" or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}")

LLAMA3_TEMPLATE = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
                   "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
                   "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# Llama 3.1-like (tools branch left out): a system block always, with the knowledge-cutoff lines
LLAMA31_TEMPLATE = (
    "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{{- system_message }}\n{{- \"<|eot_id|>\" }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n")

MISTRAL_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}")

CHAT_MESSAGES = [  # (system or None, user)
    (None, "What is 2 + 2?"),
    ("You are a helpful math assistant. Answer with a number.", "Natalia sold clips to 48 of her friends in April. How many?"),
    ("Think step by step, then give the answer in <answer></answer> tags.", "Using [3, 7, 25, 50], make 100."),
    ("  padded system  \n", "\n  padded user\t \n"),
    ("", "empty system"),
    (None, "多语言：你好，世界！ Ça va? 😀"),
    ("System with <|im_end|> inside", "user with <|eot_id|> and <think> inside"),
    (None, ""),
]


def write_config(d, kind, tok_json):
    ids = {t["content"]: t for t in tok_json["added_tokens"]}
    dec = {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
           for t in tok_json["added_tokens"]}
    if kind == "qwen2":
        cfg = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": dec,
               "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
               "chat_template": QWEN25_TEMPLATE, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
               "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
               "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
        gen = {"bos_token_id": ids["<|endoftext|>"]["id"], "eos_token_id": [ids["<|im_end|>"]["id"], ids["<|endoftext|>"]["id"]],
               "pad_token_id": ids["<|endoftext|>"]["id"], "do_sample": True, "temperature": 0.7, "top_p": 0.8}
    elif kind == "llama3":
        cfg = {"added_tokens_decoder": dec, "bos_token": "<|begin_of_text|>", "chat_template": LLAMA3_TEMPLATE,
               "clean_up_tokenization_spaces": True, "eos_token": "<|eot_id|>",
               "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 1000000000000000019884624838656,
               "tokenizer_class": "PreTrainedTokenizerFast"}
        gen = {"bos_token_id": ids["<|begin_of_text|>"]["id"],
               "eos_token_id": [ids["<|end_of_text|>"]["id"], ids["<|eot_id|>"]["id"]], "do_sample": True}
    else:
        cfg = {"added_tokens_decoder": dec, "bos_token": {"content": "<s>", "lstrip": False, "normalized": False,
                                                          "rstrip": False, "single_word": False, "__type": "AddedToken"},
               "eos_token": {"content": "</s>", "__type": "AddedToken"}, "chat_template": MISTRAL_TEMPLATE,
               "tokenizer_class": "PreTrainedTokenizerFast"}
        gen = {"eos_token_id": ids["</s>"]["id"]}
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    return cfg


def render_chat(d, template, system, user, extra=None):
    """transformers' apply_chat_template -> text (we tokenize it with the tokenizers library:
    apply_chat_template(tokenize=True) is exactly that with add_special_tokens=False)."""
    from transformers import PreTrainedTokenizerFast
    global _HF_CHAT
    if d not in _HF_CHAT:
        cfg = json.load(open(os.path.join(d, "tokenizer_config.json")))
        bos = cfg.get("bos_token")
        eos = cfg.get("eos_token")
        bos = bos["content"] if isinstance(bos, dict) else bos
        eos = eos["content"] if isinstance(eos, dict) else eos
        _HF_CHAT[d] = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"), bos_token=bos, eos_token=eos)
    t = _HF_CHAT[d]
    msgs = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": user}]
    return t.apply_chat_template(msgs, chat_template=template, add_generation_prompt=True, tokenize=False, **(extra or {}))


_HF_CHAT = {}


# ----------------------------------------------------------------------------
# the strings checked

def edge_strings(kind):
    s = [
        "", " ", "  ", "   ", " " * 17, "\n", "\n\n", "\n\n\n\n", "\r\n", "\r\n\r\n", "\r", "\t", "\t\t", " \n ", "  \n  \n",
        " \t \n\t", "a", "A", "hello", " hello", "  hello", "hello ", "hello  ", "hello   world", "hello\n\nworld",
        "hello \n world", "Hello World!", "foo  \n\n  bar  ", "x" * 300, "ab" * 100, "\n" * 40, " " * 100 + "x",
        "0", "12", "123", "1234", "12345", "1234567890123456789", "3.14159", "1,000,000", "-42", "+7", "0.5e-10",
        "2024-07-26", "x²+y²=z²", "½¼", "①②③", "٣٤٥", "１２３", "Ⅻ", "abc123def456", "1a2b3c", " 123 ", "$100",
        "I'm", "DON'T", "we'LL", "it's", "'s", "'S", "’s", "'ſ", "'ve'd'm", "x'y", "can't've", "''", "'", "'''abc",
        "café", "cafe\u0301", "Cafe\u0301 au lait", "\u212b", "\u00c5", "A\u030a", "\u1112\u1161\u11ab", "한국어",
        "e\u0301\u0323", "e\u0323\u0301", "\u1e0b\u0323", "q\u0307\u0323", "\u1f71", "\uf900", "\u0344", "ﬁ", "Tiếng Việt",
        "Tie\u0302\u0301ng Vie\u0323\u0302t", "\u0301", " \u0301", "a\u0301\u0301\u0301", "\u0958", "\u2126",
        "👨‍👩‍👧‍👦", "🇫🇷", "👍🏽", "a\u200db", "a\u200cb", "\ufeffBOM", "a\u00a0b", "a\u3000b", "a\u2028b", "a\u0085b",
        "a\u180eb", "a\u000bb\u000cc", "a\u001cb\u001fc", "a\u2009b\u200ab", "\u00a0\u00a0x", "x\u00a0\u00a0",
        "def f(x):\n    return x**2\n", "int main() {\n\treturn 0;\n}\n", '{"a": [1, 2, {"b": null}]}',
        "    if (a && b) { c(); }", "<div class=\"x\">&nbsp;</div>", "a\\nb\\tc", "path/to/file.txt", "~/.bashrc",
        "::", ":::", "a::b", "a||b", "|", "#tag", "a#b#", "~~~", "a~b~~c", "x" + "~" * 5,
        "!!!", "...", "?!", "—–-", "«»", "()[]{}", "@#$%^&*", " !", "  !!", "!\n", "!\n\n", " ...\r\n",
        "ÀÁÂÃÄÅ", "ÆÇ", "ǅ", "ß", "ẞ", "İ", "ı", "ﬃ", "ῼ",
        "你好", "你好世界", " 你好", "日本語", "ｶﾀｶﾅ", "𠀀𠀁", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\U0001f600" * 5,
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "a<|endoftext|>b", "<|im_start", "<|im_start|", "<<|im_end|>>", "<|endoftext|><|endoftext|>",
        " <|im_end|> ", "<|im_end|>\n\n", "<think>x</think>", "<tool_call>{}</tool_call>", "<|fim_prefix|>a<|fim_suffix|>",
        "<|begin_of_text|>", "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "<|eot_id|><|eot_id|>",
        "<|reserved_special_token_17|>", "<|reserved_special_token_250|>", "<|reserved_special_token_251|>",
        "<s>", "</s>", "<s>a</s>", "a <mask> b", "a   <mask>", "<mask>   a", "[R]   x", "x [R]\n\ny",
        "word", "a word here", "words", "sword", "word_", "_word", "word.", "café crème", "cafe\u0301 noir",
        "<both>", "  <both>  ", "x<both>y",
    ]
    # invalid UTF-8 (raw bytes)
    b = [b"\xff", b"abc\x80def", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82 x", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
         b"\xc0\xaf", b"\xc1\xbf", b"caf\xe9", b"\xf0\x9f\x98", b"\xf0\x9f\x98 ok", b"\xfe\xfe\xff\xff",
         b"\xe0\x80\x80", b"\xf0\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\x80\x80\x80", b"a\xc3\xa9\xe9b",
         b"<|im_end|>\xff<|im_end|>", b"\xef\xbf\xbd", b"12\xff34", b"\xed\x9f\xbf\xee\x80\x80"]
    return [x.encode("utf-8") for x in s] + b


FRAGMENTS = ["a", "the", " the", "The", " quick", "fox", "I", "'m", "'S", "'ll", "n't", "don't", " ", "  ", "   ", "\t",
             "\n", "\n\n", "\r\n", "\r", " \n", "0", "7", "42", "123", "2024", "99999", "3.14", ",", ".", "!", "?", "...",
             "-", "—", "(", ")", "[", "]", "{", "}", "\"", "'", "`", ":", ";", "::", "|", "#", "~", "_", "=", "==", "+",
             "*", "/", "\\", "<", ">", "@", "$", "%", "&", "é", "e\u0301", "ü", "u\u0308", "ñ", "Å", "\u212b", "ß", "ç",
             "œ", "İ", "ı", "Ω", "\u2126", "λ", "я", "Москва", "ά", "\u1f71", "שלום", "مرحبا", "١٢", "नमस्ते", "你", "好",
             "世界", "。", "，", "日本", "カタカナ", "ｶﾀ", "한", "\u1112\u1161\u11ab", "국", "ไทย", "😀", "👍🏽", "👨‍👩‍👧",
             "🇯🇵", "❤️", "\u200d", "\u00a0", "\u3000", "\u2028", "\u0085", "\u180e", "\ufeff", "\u0301", "\u0323",
             "ﬁ", "①", "²", "½", "１", "Ⅻ", "\U0001d518", "𠀀", "def", "return", "{\n", "    ", "\t\t", "x = 1;",
             "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "<|eot_id|>", "<|begin_of_text|>",
             "<|start_header_id|>", "<s>", "</s>", "<mask>", "[R]", "word", "café", "<both>", "<|", "|>"]


def random_strings(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, 24)
        out.append("".join(rng.choice(FRAGMENTS) for _ in range(k)).encode("utf-8"))
    # random code points from all planes, in letter/number/space contexts
    for _ in range(n // 4):
        cps = []
        for _ in range(rng.randint(1, 12)):
            while True:
                cp = rng.choice([rng.randint(0x20, 0x7ff), rng.randint(0x800, 0xffff), rng.randint(0x10000, 0x10ffff)])
                if not (0xd800 <= cp < 0xe000):
                    break
            cps.append(chr(cp))
            cps.append(rng.choice(["", "", " ", "a", "1", "\n", "'s", "\u0301"]))
        out.append("".join(cps).encode("utf-8"))
    return out


def corpus_strings(corpus, n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        i = rng.randrange(len(corpus))
        ln = rng.choice([10, 40, 120, 400, 1500])
        out.append(corpus[i:i + ln].encode("utf-8"))
    return out


def hf_cases(tok, strings):
    """each distinct string (bytes, first occurrence order) with HF's ids (without and with special
    tokens) and decodes (keeping and skipping special tokens), as cases.json stores them"""
    seen, uniq = set(), []
    for s in strings:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    cases = []
    for raw in uniq:
        text = raw.decode("utf-8", "replace")
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_sp = tok.encode(text, add_special_tokens=True).ids
        dec = tok.decode(ids, skip_special_tokens=False)
        dec_skip = tok.decode(ids, skip_special_tokens=True)
        cases.append({"hex": raw.hex(), "ids": ids, "ids_special": ids_sp, "decoded_hex": dec.encode("utf-8").hex(),
                      "decoded_skip_hex": dec_skip.encode("utf-8").hex()})
    return cases


def make_cases(d, kind, tok_json, corpus):
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    strings = edge_strings(kind) + random_strings(240, seed=7 + len(kind)) + corpus_strings(corpus, 60, seed=11)
    if kind == "llama3":  # the whole-word entries, alone and in company
        u2b = {c: b for b, c in bytes_to_unicode().items()}
        words = [bytes(u2b[c] for c in w) for w in UNREACHABLE]
        strings += words + [b"x" + w + b"," + w.upper() + b"\n" + w for w in words]
    cases = hf_cases(tok, strings)
    if kind == "llama3":  # how many strings does ignore_merges change? (the fixture must exercise it)
        j2 = json.loads(json.dumps(tok_json))
        j2["model"]["ignore_merges"] = False
        t2 = Tokenizer.from_str(json.dumps(j2))
        texts = [bytes.fromhex(c["hex"]).decode("utf-8", "replace") for c in cases]
        nd = sum(1 for x in texts if t2.encode(x, add_special_tokens=False).ids != tok.encode(x, add_special_tokens=False).ids)
        print(f"  llama3: ignore_merges changes the ids of {nd} of {len(texts)} strings")
    # chat prompts
    chats = []
    variants = {"qwen2": [("qwen2.5", QWEN25_TEMPLATE, None), ("qwen2", QWEN2_TEMPLATE, None),
                          ("qwen3", QWEN3_TEMPLATE, None)],
                "llama3": [("llama3", LLAMA3_TEMPLATE, None), ("llama3.1", LLAMA31_TEMPLATE, None)],
                "gpt2": []}[kind]
    for name, tmpl, extra in variants:
        for system, user in CHAT_MESSAGES:
            text = render_chat(d, tmpl, system, user, extra)
            ids = tok.encode(text, add_special_tokens=False).ids
            chats.append({"template": name, "system": system, "user": user, "text": text, "ids": ids})
    with open(os.path.join(d, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer": kind, "hf_tokenizers_version": __import__("tokenizers").__version__,
                   "cases": cases, "chat": chats,
                   "templates": {n: t for n, t, _ in variants} | ({"mistral": MISTRAL_TEMPLATE} if kind == "llama3" else {})},
                  f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    return len(cases), len(chats)


def make_tokenizer(kind, corpus):
    d = os.path.join(FIX, kind)
    os.makedirs(d, exist_ok=True)
    if kind == "qwen2":
        tok = train(corpus, QWEN_RE, True, 4000, QWEN_ADDED)
    elif kind == "llama3":
        tok = train(corpus, LLAMA_RE, False, 4000, llama_added())
    else:
        tok = train(corpus[:40000], None, True, 600, [("<s>", True), ("</s>", True)], gpt2=True)
    j = finish_json(tok, kind, corpus)
    if kind == "gpt2":  # the odd added tokens must not be vocabulary entries (HF would take those ids)
        b2u = bytes_to_unicode()
        for t in j["added_tokens"]:
            assert "".join(b2u[b] for b in t["content"].encode()) not in j["model"]["vocab"], t
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=1 if kind == "llama3" else None)
    Tokenizer.from_file(os.path.join(d, "tokenizer.json"))  # HF must accept what we wrote
    write_config(d, kind, j)
    nc, nchat = make_cases(d, kind, j, corpus)
    print(f"  {kind}: vocab {len(j['model']['vocab'])}, merges {len(j['model']['merges'])}, "
          f"added {len(j['added_tokens'])}; {nc} strings, {nchat} chat prompts")


# ----------------------------------------------------------------------------
# NFC: tables for tokenizer.c, and cases, both matched to what HF's normalizer does
# (tokenizers uses the unicode-normalization-alignments crate, whose Unicode data is older
# than Python's: we take Python's tables and drop what HF does not know, then check every
# decomposable character and every combining mark against HF).

def nfc_tables_and_cases():
    hf = normalizers.NFC()
    decomp = []  # (cp, a, b, composes)
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000 or 0xAC00 <= cp <= 0xD7A3:
            continue
        d = unicodedata.decomposition(chr(cp))
        if not d or d.startswith("<"):
            continue
        parts = [int(x, 16) for x in d.split()]
        assert 1 <= len(parts) <= 2
        a, b = parts[0], parts[1] if len(parts) == 2 else 0
        # HF's NFD must agree with the mapping (older data would not decompose it at all)
        if normalizers.NFD().normalize_str(chr(cp)) == chr(cp):
            continue
        composes = len(parts) == 2 and hf.normalize_str(chr(a) + chr(b)) == chr(cp) and \
            hf.normalize_str(chr(cp)) == chr(cp)
        decomp.append((cp, a, b, int(composes)))
    # canonical combining classes, as HF sees them: a mark HF orders like class 0 (its data
    # predates the mark) is left out
    ccc = []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = unicodedata.combining(chr(cp))
        if not c:
            continue
        if c < 230:  # after a class-230 mark: HF moves it in front iff it knows its class
            s = "q\u0301" + chr(cp)
        elif c > 230:
            s = "q" + chr(cp) + "\u0301"
        else:  # class 230: compare with a class-220 mark
            s = "q" + chr(cp) + "\u0316"
        if hf.normalize_str(s) == s:
            continue
        ccc.append((cp, c))
    ranges = []
    for cp, c in ccc:
        if ranges and ranges[-1][1] == cp - 1 and ranges[-1][2] == c:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp, c])
    return decomp, ranges


def write_unicode_header(decomp, ranges, fixups):
    path = os.path.join(ROOT, "tokenizer_unicode.h")
    with open(path, "w") as f:
        f.write("// tokenizer_unicode.h: Unicode tables for tokenizer.c, generated by\n"
                "// dev/make_tokenizer_fixtures.py --tables (do not edit by hand).\n"
                "// NFC (Qwen2's tokenizer.json asks for it): from Python's unicodedata "
                f"{unicodedata.unidata_version}, trimmed\n"
                "// to what Hugging Face tokenizers' NFC knows (its unicode-normalization-alignments crate\n"
                "// has older Unicode data: a few recent marks and compositions are missing there, so here).\n"
                "// Hangul syllables are algorithmic and not listed.\n"
                "// Regex classes: where PCRE2 10.42's tables and HF's Oniguruma disagree on \\p{L} / \\p{N} / \\s.\n"
                "#ifndef TOKENIZER_UNICODE_H\n#define TOKENIZER_UNICODE_H\n#include <stdint.h>\n\n")
        f.write("// canonical decompositions, sorted by code point: {cp, first, second (0: singleton),\n"
                "// 1 if (first, second) composes back to cp in NFC}\n")
        f.write(f"static const uint32_t nfc_decomp[{len(decomp)}][4] = {{\n")
        for i in range(0, len(decomp), 4):
            f.write("    " + " ".join("{0x%X,0x%X,0x%X,%d}," % e for e in decomp[i:i + 4]) + "\n")
        f.write("};\n\n// canonical combining classes (non-zero), as ranges {first, last, class}\n")
        f.write(f"static const uint32_t nfc_ccc[{len(ranges)}][3] = {{\n")
        for i in range(0, len(ranges), 5):
            f.write("    " + " ".join("{0x%X,0x%X,%d}," % tuple(r) for r in ranges[i:i + 5]) + "\n")
        f.write("};\n\n// the class Oniguruma gives these characters, where PCRE2 differs: {first, last, class}\n"
                "// class 0: \\p{L}, 1: \\p{N}, 2: \\s, 3: none of them\n")
        f.write(f"static const uint32_t re_class_fix[{len(fixups)}][3] = {{\n")
        for i in range(0, len(fixups), 4):
            f.write("    " + " ".join("{0x%X,0x%X,%d}," % tuple(r) for r in fixups[i:i + 4]) + "\n")
        f.write("};\n\n#endif  // TOKENIZER_UNICODE_H\n")
    print(f"  wrote {path}: {len(decomp)} decompositions, {len(ranges)} ccc ranges, {len(fixups)} regex class fixes")


def nfc_cases(decomp, seed=5):
    """Every decomposable character (and its NFD), every combining mark after other marks,
    a sample of Hangul; expected = HF's NFC. One line each: input hex cps ; expected hex cps."""
    hf = normalizers.NFC()
    rng = random.Random(seed)
    inputs = []
    for cp, a, b, _ in decomp:
        inputs.append(chr(cp))
        inputs.append(unicodedata.normalize("NFD", chr(cp)))
    marks = [cp for cp in range(0x110000) if not (0xD800 <= cp < 0xE000) and unicodedata.combining(chr(cp))]
    for m in marks:
        inputs.append("a" + chr(m) + "\u0301" + chr(m) + "\u0316")
    for _ in range(400):
        s = chr(rng.randint(0xAC00, 0xD7A3))
        inputs.append(unicodedata.normalize("NFD", s) + rng.choice(["", "\u11a8", "\u1161", "\u0301"]))
        inputs.append(s + rng.choice(["\u11a8", "\u11c2", "\u1161", "a"]))
    for _ in range(600):  # random mixes of starters and marks
        s = "".join(chr(rng.choice([rng.choice(marks), rng.randint(0x41, 0x7a), rng.randint(0xc0, 0x24f),
                                    rng.randint(0x1100, 0x1175), rng.choice([c for c, *_ in decomp])]))
                    for _ in range(rng.randint(2, 6)))
        inputs.append(s)
    lines = []
    for s in inputs:
        out = hf.normalize_str(s)
        lines.append(" ".join("%X" % ord(c) for c in s) + ";" + " ".join("%X" % ord(c) for c in out))
    with open(os.path.join(FIX, "nfc_cases.txt"), "w") as f:
        f.write("# input code points ; Hugging Face tokenizers NFC of them (dev/make_tokenizer_fixtures.py)\n")
        f.write("\n".join(lines) + "\n")
    print(f"  nfc_cases.txt: {len(lines)} strings")


PCRE2_SPACE = set([9, 10, 11, 12, 13, 0x20, 0x85, 0xA0, 0x1680, 0x180E, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000] +
                  list(range(0x2000, 0x200B)))


def onig_classes():
    """For every code point c, the class HF's Llama-3 Split regex (Oniguruma) gives it, from three
    probes: 0 L: 'a'+c is one piece; 1 N: c+'1' is one piece; 2 S: c+' ' is one piece; 3 other.
    (CR and LF probe as 'other'; they are ASCII, where the engines agree.)"""
    split = pre_tokenizers.Split(Regex(LLAMA_RE), behavior="isolated")
    cls = bytearray(0x110000)
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000 or cp == 0:
            cls[cp] = 3
            continue
        c = chr(cp)
        if len(split.pre_tokenize_str("a" + c)) == 1:
            cls[cp] = 0
        elif len(split.pre_tokenize_str(c + "1")) == 1:
            cls[cp] = 1
        elif len(split.pre_tokenize_str(c + " ")) == 1:
            cls[cp] = 2
        else:
            cls[cp] = 3
    return cls


def pcre2_class(cp):
    """The class PCRE2 10.42 (UTF|UCP, Unicode 14 tables, like Python 3.11's unicodedata) gives cp:
    \\p{L}, \\p{N}, \\s (= \\p{Z}, \\h, \\v: PCRE2's \\h still lists U+180E), other."""
    cat = unicodedata.category(chr(cp))
    if cat[0] == "L":
        return 0
    if cat[0] == "N":
        return 1
    if cp in PCRE2_SPACE or cat in ("Zs", "Zl", "Zp"):
        return 2
    return 3


def class_fixups(cls):
    """Ranges where Oniguruma's class differs from PCRE2's: U+180E (no longer a space since
    Unicode 6.3, still in PCRE2's \\h) and characters newer than PCRE2's Unicode tables."""
    r = []
    for cp in range(0x80, 0x110000):
        if 0xD800 <= cp < 0xE000 or cls[cp] == pcre2_class(cp):
            continue
        if r and r[-1][1] == cp - 1 and r[-1][2] == cls[cp]:
            r[-1][1] = cp
        else:
            r.append([cp, cp, cls[cp]])
    return r


def write_class_fixtures(cls):
    out = bytearray(65536 // 4)
    counts = [0] * 4
    for cp in range(65536):
        counts[cls[cp]] += 1
        out[cp // 4] |= cls[cp] << (2 * (cp % 4))
    with open(os.path.join(FIX, "classes_bmp.bin"), "wb") as f:
        f.write(out)
    # beyond the BMP: every character where the engines' tables differ, and a sample of the rest
    rng = random.Random(3)
    supp = [cp for cp in range(0x10000, 0x110000) if cls[cp] != pcre2_class(cp)]
    supp += rng.sample(range(0x10000, 0x110000), 3000)
    with open(os.path.join(FIX, "classes_supp.txt"), "w") as f:
        f.write("# code point (hex) and its class in HF's Llama-3 regex: 0 L, 1 N, 2 S, 3 other\n")
        for cp in sorted(set(supp)):
            f.write("%X %d\n" % (cp, cls[cp]))
    print(f"  classes_bmp.bin: L {counts[0]}, N {counts[1]}, S {counts[2]}, other {counts[3]}; "
          f"classes_supp.txt: {len(set(supp))} code points")


# ----------------------------------------------------------------------------
# the benchmark tokenizer: ~151k vocab trained on a generated corpus, Qwen2 structure

def bench(outdir):
    os.makedirs(outdir, exist_ok=True)
    rng = random.Random(99)
    scripts = [
        "abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnopqrstuvwxyzéèàùçâêîôûëïü", "абвгдеёжзийклмнопрстуфхцчшщъыьэюя",
        "αβγδεζηθικλμνξοπρστυφχψω", "".join(chr(c) for c in range(0x4e00, 0x4e00 + 3000)),
        "".join(chr(c) for c in range(0xac00, 0xac00 + 2000)), "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
        "अआइईउऊएऐओऔकखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसह",
    ]
    words = set()
    while len(words) < 400_000:
        sc = rng.choice(scripts)
        n = rng.randint(1, 3) if sc[0] in "\u4e00\uac00" else rng.randint(2, 12)
        w = "".join(rng.choice(sc) for _ in range(n))
        if rng.random() < 0.1:
            w = w.capitalize()
        words.add(w)
    words = sorted(words)
    rng.shuffle(words)
    cum, acc = [], 0.0  # Zipf-like frequencies (cumulative, so each draw is a bisection)
    for i in range(len(words)):
        acc += 1.0 / (i + 10)
        cum.append(acc)
    lines = corpus_lines()

    def text(nbytes, seed):
        r = random.Random(seed)
        parts, size = [], 0
        while size < nbytes:
            if r.random() < 0.05:
                p = r.choice(lines) + "\n"
            else:
                ws = r.choices(words, cum_weights=cum, k=r.randint(3, 15))
                p = " ".join(ws) + r.choice([". ", ", ", "! ", "\n", " ", " " + str(r.randint(0, 99999)) + " "])
            parts.append(p)
            size += len(p.encode("utf-8"))
        return "".join(parts)

    t0 = time.time()
    corpus = text(40_000_000, 1)
    print(f"  bench corpus: {len(corpus.encode()) / 1e6:.1f} MB in {time.time() - t0:.1f} s; training 151643 vocab ...")
    t0 = time.time()
    tok = train(corpus, QWEN_RE, True, 151643, QWEN_ADDED)
    j = finish_json(tok, "qwen2")
    print(f"  trained in {time.time() - t0:.1f} s: vocab {len(j['model']['vocab'])}, merges {len(j['model']['merges'])}")
    path = os.path.join(outdir, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    sample = text(1_000_000, 2)
    with open(os.path.join(outdir, "text_1mb.txt"), "w", encoding="utf-8") as f:
        f.write(sample)
    hf = Tokenizer.from_file(path)
    t0 = time.time()
    hf.from_file(path)
    tload = time.time() - t0
    os.environ["RAYON_NUM_THREADS"] = "1"
    t0 = time.time()
    ids = hf.encode(sample, add_special_tokens=False).ids
    tenc = time.time() - t0
    import array
    with open(os.path.join(outdir, "text_1mb.ids"), "wb") as f:
        array.array("i", ids).tofile(f)
    with open(os.path.join(outdir, "hf_times.txt"), "w") as f:
        f.write(f"hf_load_s {tload:.3f}\nhf_encode_s {tenc:.3f}\nbytes {len(sample.encode())}\ntokens {len(ids)}\n")
    print(f"  {path}: {os.path.getsize(path) / 1e6:.1f} MB; HF load {tload:.3f} s, HF encode of "
          f"{len(sample.encode()) / 1e6:.2f} MB: {tenc:.3f} s, {len(ids)} tokens")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", action="store_true", help="regenerate tokenizer_unicode.h")
    ap.add_argument("--bench", action="store_true", help="build the 151k-vocab benchmark tokenizer in build/tokenizer_bench")
    args = ap.parse_args()
    if args.bench:
        bench(os.path.join(ROOT, "build", "tokenizer_bench"))
        return
    os.makedirs(FIX, exist_ok=True)
    corpus = build_corpus()
    print(f"corpus: {len(corpus.encode())} bytes")
    for kind in ("qwen2", "llama3", "gpt2"):
        make_tokenizer(kind, corpus)
    decomp, ranges = nfc_tables_and_cases()
    cls = onig_classes()
    if args.tables:
        write_unicode_header(decomp, ranges, class_fixups(cls))
    nfc_cases(decomp)
    write_class_fixtures(cls)


if __name__ == "__main__":
    main()
