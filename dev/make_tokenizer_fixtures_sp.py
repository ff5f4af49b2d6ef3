#!/usr/bin/env python3
# dev/make_tokenizer_fixtures_sp.py: the truth for tokenizer.c beyond Qwen/Llama 3's byte-level
# BPE, made with Hugging Face `tokenizers`: SentencePiece-style BPE (characters as symbols,
# <0xNN> byte fallback, U+2581 for spaces) and a byte-level BPE with the Digits pre-tokenizer.
#
#   python3 dev/make_tokenizer_fixtures_sp.py     # test/fixtures/tokenizer/{gemma,mistral,llama2,smollm,sp_odd,sp_plain}/
#                                                 # and numeric.txt (what Digits splits off)
#   python3 dev/make_tokenizer_fixtures_sp.py --chat   # gemma/ and mistral/'s chat templates and prompts alone
#
# As in dev/make_tokenizer_fixtures.py (whose corpus and strings this reuses), we cannot
# download the real tokenizers, so we train small ones on the corpus with exactly the real
# files' pipeline and save them the way the checkpoints ship them:
#   gemma/    Gemma 3: normalizer Replace(" " -> "▁"), no pre-tokenizer, BPE byte_fallback with
#             unk <unk> (fuse_unk), <0x00>..<0xFF> in the vocabulary, whitespace-run tokens,
#             decoder Sequence[Replace("▁" -> " "), ByteFallback, Fuse], <bos> prepended;
#             <start_of_turn>, <end_of_turn>; chat templates Gemma 3 (config) and Gemma 2
#   mistral/  Mistral v0.3 / Llama 2 (legacy=False): pre-tokenizer Metaspace(prepend_scheme
#             "first", split false), decoder Sequence[Replace, ByteFallback, Fuse, Strip(" ", 1, 0)],
#             <s> prepended; [INST], [/INST]; chat templates Mistral v0.3 (config), v0.2 and v0.1
#   smollm/   SmolLM: pre-tokenizer Sequence[Digits(individual_digits), ByteLevel(use_regex)],
#             decoder ByteLevel; <|im_start|>, <|im_end|>, <|endoftext|>
#   llama2/   Llama 2 / Mistral v0.1 (legacy=True): normalizer Sequence[Prepend("▁"), Replace(" " -> "▁")],
#             no pre-tokenizer, the same decoder as mistral/
#   sp_plain/ no byte fallback (a character outside the vocabulary is <unk>, not fused), ignore_merges,
#             pre-tokenizer Metaspace(prepend_scheme "never", split), decoder Metaspace alone (a few
#             hundred strings)
#   sp_odd/   the rarely used branches: normalizers NFC + Prepend + Replace (Llama 2 legacy),
#             pre-tokenizers Digits (contiguous) + Metaspace(always, split), byte tokens missing for
#             4-byte characters (so unk, not fused), a normalized added token, decoders
#             Replace / ByteFallback / Metaspace before Fuse and Strip / Replace after it
# The characters the training leaves out of the vocabulary (limit_alphabet) are what byte
# fallback is for: emoji, rare CJK, scripts seen once. Each directory holds tokenizer.json,
# tokenizer_config.json and cases.json (the same format as the byte-level fixtures: hex of the
# raw bytes, HF's ids with and without special tokens, HF's decode with and without them).
import json
import os
import random
import sys

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_fixtures import (CHAT_MESSAGES, FIX, build_corpus, corpus_strings, edge_strings, hf_cases,  # noqa: E402
                                     random_strings, render_chat)

SP = "\u2581"
BYTES = ["<0x%02X>" % b for b in range(256)]

SPECIALS = {  # (content, special): at the front of the vocabulary, as added tokens with the same ids
    "gemma": [("<pad>", True), ("<eos>", True), ("<bos>", True), ("<unk>", True), ("<mask>", True),
              ("<start_of_turn>", True), ("<end_of_turn>", True), ("<start_of_image>", True)],
    "mistral": [("<unk>", True), ("<s>", True), ("</s>", True), ("[INST]", True), ("[/INST]", True),
                ("[TOOL_CALLS]", True), ("[AVAILABLE_TOOLS]", True)],
    "sp_odd": [("<unk>", True), ("<s>", True), ("</s>", True)],
    "llama2": [("<unk>", True), ("<s>", True), ("</s>", True)],
    "sp_plain": [("<unk>", True), ("<s>", True), ("</s>", True)],
    "smollm": [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<repo_name>", True),
               ("<file_sep>", True), ("<filename>", True)],
}


# chat templates, as the real tokenizer_config.json's write them (the image and tool branches left out)
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n            {%- endif -%}\n"
    "        {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\\n'}}\n{%- endif -%}\n")

# Gemma 1 and 2: no system role
GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")

# Mistral-7B-Instruct-v0.3: the system message before the last user message's
MISTRAL_V03_TEMPLATE = (
    "{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = messages[0][\"content\"] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n"
    "{%- set user_messages = loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list %}\n\n"
    "{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n"
    "        {%- if loop.last and system_message is defined %}\n"
    "            {{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n"
    "        {%- else %}\n            {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n"
    "    {%- elif message[\"role\"] == \"assistant\" %}\n        {{- \" \" + message[\"content\"]|trim + eos_token}}\n"
    "    {%- else %}\n        {{- raise_exception(\"Only user and assistant roles are supported, with the exception of an "
    "initial optional system message!\") }}\n    {%- endif %}\n{%- endfor %}\n")

# Mistral-7B-Instruct-v0.2 (the updated file): spaces around the markers, the system message in the first turn
MISTRAL_V02_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n"
    "{{- bos_token }}\n{%- for message in loop_messages %}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
    "        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}\n"
    "    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {%- if loop.first and system_message is defined %}\n"
    "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n"
    "            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n"
    "    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n"
    "    {%- else %}\n        {{- raise_exception('Only user and assistant roles are supported, with the exception of an "
    "initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n")

# Mistral-7B-Instruct-v0.1: no system role
MISTRAL_V01_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

# (name, template, takes a system message): the first is the one tokenizer_config.json carries
CHAT_TEMPLATES = {"gemma": [("gemma3", GEMMA3_TEMPLATE, True), ("gemma2", GEMMA2_TEMPLATE, False)],
                  "mistral": [("mistral-v0.3", MISTRAL_V03_TEMPLATE, True), ("mistral-v0.2", MISTRAL_V02_TEMPLATE, True),
                              ("mistral-v0.1", MISTRAL_V01_TEMPLATE, False)]}


def chat_cases(d, kind):
    """transformers' apply_chat_template for each template and message pair (no system message
    where the template refuses one), tokenized with add_special_tokens=False as it does."""
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    chats = []
    for name, tmpl, system_ok in CHAT_TEMPLATES.get(kind, []):
        for system, user in CHAT_MESSAGES:
            if system is not None and not system_ok:
                continue
            text = render_chat(d, tmpl, system, user)
            chats.append({"template": name, "system": system, "user": user, "text": text,
                          "ids": tok.encode(text, add_special_tokens=False).ids})
    return chats, {n: t for n, t, _ in CHAT_TEMPLATES.get(kind, [])}


def train_sp(corpus, kind, vocab_size, limit_alphabet):
    """A SentencePiece-style BPE: trained on words split at U+2581 (as SentencePiece trains), then
    the vocabulary laid out as the real files have it: special tokens, the 256 byte tokens, the rest."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", SP)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="first", split=True)
    # the alphabet: the limit_alphabet most frequent characters, ties by code point (the trainer's
    # own limit_alphabet breaks ties by hash order, so the files would change from run to run)
    counts = {}
    for ch in corpus.replace(" ", SP):
        counts[ch] = counts.get(ch, 0) + 1
    keep = set(sorted(counts, key=lambda ch: (-counts[ch], ch))[:limit_alphabet]) | {" "}
    corpus = "".join(ch for ch in corpus if ch in keep)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False, special_tokens=[])
    tok.train_from_iterator([corpus[i:i + 4096] for i in range(0, len(corpus), 4096)], trainer=trainer)
    j = json.loads(tok.to_str())
    trained = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, list) else m.split(" ") for m in j["model"]["merges"]]
    specials = SPECIALS[kind]
    skip_bytes = set()
    if kind == "sp_odd":  # no byte tokens for the lead bytes of 4-byte characters: those become <unk>
        skip_bytes = set(range(0xF0, 0xF5))
    if kind == "sp_plain":  # no byte fallback at all: a character outside the vocabulary is <unk>
        skip_bytes = set(range(256))
    vocab = {}
    for c, _ in specials:
        vocab[c] = len(vocab)
    for b in range(256):
        if b not in skip_bytes:
            vocab[BYTES[b]] = len(vocab)
    for s, _ in trained:
        if s not in vocab:
            vocab[s] = len(vocab)
    if kind not in ("sp_odd", "sp_plain"):  # whitespace runs, as Gemma and Llama have ("▁▁", "▁▁▁▁", ...)
        for n in (2, 3, 4, 8, 16):
            r = SP * n
            if r not in vocab:
                vocab[r] = len(vocab)
                a = SP * (n // 2) if n % 2 == 0 else SP * (n - 1)
                merges.append([a, SP * (n - len(a))])
    m = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": kind not in ("sp_odd", "sp_plain"), "byte_fallback": kind != "sp_plain",
         "ignore_merges": kind == "sp_plain",
         "vocab": vocab, "merges": merges}
    added = [dict(id=vocab[c], content=c, single_word=False, lstrip=False, rstrip=False, normalized=False, special=s)
             for c, s in specials]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": None, "post_processor": None, "decoder": None, "model": m}


def template(tok_json, first):
    ids = {t["content"]: t["id"] for t in tok_json["added_tokens"]}
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": first, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": first, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": first, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {first: {"id": first, "ids": [ids[first]], "tokens": [first]}}}


def replace(a, b):
    return {"type": "Replace", "pattern": {"String": a}, "content": b}


def make_json(kind, corpus):
    if kind == "smollm":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=1, show_progress=False, special_tokens=[c for c, _ in SPECIALS[kind]],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator([corpus[i:i + 4096] for i in range(0, len(corpus), 4096)], trainer=trainer)
        j = json.loads(tok.to_str())
        j["model"].update(dropout=None, unk_token=None, continuing_subword_prefix=None, end_of_word_suffix=None,
                          fuse_unk=False, byte_fallback=False, ignore_merges=False)
        j["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=False, trim_offsets=True, use_regex=True)
        j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
        j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        return j
    if kind == "gemma":
        j = train_sp(corpus, kind, 3000, 200)
        j["normalizer"] = replace(" ", SP)
        j["post_processor"] = template(j, "<bos>")
        j["decoder"] = {"type": "Sequence", "decoders": [replace(SP, " "), {"type": "ByteFallback"}, {"type": "Fuse"}]}
    elif kind == "mistral":
        j = train_sp(corpus, kind, 3000, 160)
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": SP, "prepend_scheme": "first", "split": False}
        j["post_processor"] = template(j, "<s>")
        j["decoder"] = {"type": "Sequence", "decoders": [replace(SP, " "), {"type": "ByteFallback"}, {"type": "Fuse"},
                                                         {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    elif kind == "llama2":  # Llama 2 and Mistral v0.1 as converted with legacy=True: no pre-tokenizer
        j = train_sp(corpus, kind, 3000, 160)
        j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SP}, replace(" ", SP)]}
        j["post_processor"] = template(j, "<s>")
        j["decoder"] = {"type": "Sequence", "decoders": [replace(SP, " "), {"type": "ByteFallback"}, {"type": "Fuse"},
                                                         {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    elif kind == "sp_plain":  # no byte fallback (unk, not fused), ignore_merges, Metaspace never / decoder alone
        j = train_sp(corpus[:40000], kind, 800, 120)
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": SP, "prepend_scheme": "never", "split": True}
        j["decoder"] = {"type": "Metaspace", "replacement": SP, "prepend_scheme": "first", "split": True}
        vocab = j["model"]["vocab"]  # whole words the merges would split: ignore_merges takes them as one token
        for w in (SP + "hello", "world", SP + "the" + SP + "quick", "123"):
            if w not in vocab:
                vocab[w] = len(vocab)
    else:  # sp_odd
        j = train_sp(corpus[:40000], kind, 800, 120)
        j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Prepend", "prepend": SP},
                                                               replace(" ", SP)]}
        j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": False},
            {"type": "Metaspace", "replacement": SP, "prepend_scheme": "always", "split": True}]}
        j["post_processor"] = template(j, "<s>")
        # "<0x41>" -> "<0x42>" before ByteFallback: the byte test comes after the steps before it
        j["decoder"] = {"type": "Sequence", "decoders": [
            replace("<0x41>", "<0x42>"), {"type": "ByteFallback"},
            {"type": "Metaspace", "replacement": SP, "prepend_scheme": "always", "split": True},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 2, "stop": 0}, replace("!", "?")]}
        nid = len(j["model"]["vocab"])  # a normalized added token: matched as the normalizer changes it
        j["added_tokens"].append(dict(id=nid, content="per cent", single_word=False, lstrip=False, rstrip=False,
                                      normalized=True, special=False))
    return j


SP_FRAGMENTS = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<start_of_turn>user\n", "<s>", "</s>", "[INST]",
                "[/INST]", " [INST] ", "<unk>", "<pad>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", SP, SP + SP, " " + SP,
                "<0x41>", "<0xFF>", "<0x", "per cent", "per  cent", "Per cent", " ", "  ", "    ", " " * 8, "\n", "\n\n", "\t",
                "a", "the", " the", "hello", " world", "0", "7", "42", "123", "2024", "999999", "3.14", "1,000", "٣٤٥", "１２",
                "²", "½", "Ⅻ", "①", "𝟙", "😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "❤️", "🤖", "\U0001fae0", "𠀀", "𪚥", "龘", "鬱", "麤",
                "齉", "\u4e00", "你好", "日本", "한국어", "ไทย", "ሰላም", "ᚠᛇᚻ", "ꦗꦮ", "Ꭰ", "ᐁ", "ئۇيغۇر", "ܐܪܡܝܐ", "ߒߞߏ",
                "é", "e\u0301", "Å", "\u212b", "ﬁ", "ß", "İ", "Ω", "я", "ά", "שלום", "مرحبا", "नमस्ते", "!", "?", "...", "!!",
                "-", "—", "(", ")", "\"", "'", "'s", ":", "::", "|", "#", "~", "_", "\u00a0", "\u3000", "\u200d", "\ufeff",
                "\r\n", "x", "Hello!", " ", "abc", "def f(x):", "    return x", "\U0010fffd", "\ue000"]


def sp_strings(n, seed):
    """Random mixes of SentencePiece-relevant pieces: U+2581 in the input, byte-token look-alikes,
    special tokens inside text, whitespace runs, digit runs, characters the vocabulary lacks."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        out.append("".join(rng.choice(SP_FRAGMENTS) for _ in range(rng.randint(1, 14))).encode("utf-8"))
    for _ in range(n // 5):  # leading and trailing spaces around a sentence
        s = " " * rng.randint(0, 5) + rng.choice(["hello world", "x", "1 2 3", "你好 世界", "😀 ok", "a  b"]) + " " * rng.randint(0, 5)
        out.append(s.encode("utf-8"))
    for _ in range(n // 5):  # digit runs in many scripts
        digits = rng.choice(["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "²³¹¼½¾", "ⅠⅡⅢⅫ"])
        s = "".join(rng.choice(digits) if rng.random() < 0.7 else rng.choice(" a.,-") for _ in range(rng.randint(1, 30)))
        out.append(s.encode("utf-8"))
    return out


EXTRA = ["", " ", SP, SP + "hello", " " + SP + " ", SP * 5, "hello" + SP + "world", "<0x41>", "<0x41><0x42>", "<0xZZ>",
         "<0x+F>", "<<0x41>>", "<bos>", "<bos><bos>", " <bos> ", "<bos>hello", "hello<eos>", "<s>", "<s> hi", "<s>hi",
         " <s>hi", "[INST] What is 2 + 2? [/INST]", "[INST]hi[/INST]", "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
         "per cent", "10 per cent", "per cent of", "per centimetre", " per cent", "hyper cent", "<unk>", "a<unk>b",
         "😀", "😀😀😀", "a😀b", " 😀", "😀 ", "\U0001fae0\U0001fae1", "𪚥𪚥", "龘", "a龘b", "\U0010fffd", "\ue000",
         "12345678901234567890", "1 2 3", "v1.2.3", "3.14159", "٣٤٥", "０１２", "x²", " " * 30, " " * 31 + "x", "\n" * 10,
         "\t\t\tx", "a" * 200, "!" * 50, "ab " * 60, " hello", "  hello", "hello ", "hello  "]


def make_cases(d, kind, corpus):
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    strings = [s.encode("utf-8") for s in EXTRA] + edge_strings(kind)
    if kind == "sp_plain":  # the smaller one: a few hundred strings
        strings += sp_strings(150, seed=21 + len(kind)) + random_strings(60, seed=7 + len(kind)) + corpus_strings(corpus, 20, seed=13)
    else:
        strings += sp_strings(420, seed=21 + len(kind)) + random_strings(200, seed=7 + len(kind)) + corpus_strings(corpus, 60, seed=13)
    cases = hf_cases(tok, strings)
    # what the fixture exercises: byte fallback and unk (ids of byte tokens / <unk> in the output)
    vocab = json.load(open(os.path.join(d, "tokenizer.json")))["model"]["vocab"]
    byte_ids = {vocab[b] for b in BYTES if b in vocab}
    unk = vocab.get("<unk>", -1)
    nb = sum(1 for c in cases if byte_ids & set(c["ids"]))
    nu = sum(1 for c in cases if unk in c["ids"])
    chats, templates = chat_cases(d, kind)
    with open(os.path.join(d, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer": kind, "hf_tokenizers_version": __import__("tokenizers").__version__,
                   "cases": cases, "chat": chats, "templates": templates}, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    return len(cases), nb, nu


def write_config(d, kind):
    bos, eos = {"gemma": ("<bos>", "<eos>"), "mistral": ("<s>", "</s>"), "sp_odd": ("<s>", "</s>"), "llama2": ("<s>", "</s>"),
                "sp_plain": ("<s>", "</s>"),
                "smollm": ("<|im_start|>", "<|im_end|>")}[kind]
    cfg = {"bos_token": bos, "eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast",
           "add_bos_token": kind != "smollm", "add_eos_token": False}
    if kind == "gemma":
        cfg["pad_token"] = "<pad>"
    if kind in CHAT_TEMPLATES:
        cfg["chat_template"] = CHAT_TEMPLATES[kind][0][1]
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)


def numeric_list():
    """Every code point HF's Digits pre-tokenizer isolates (Rust's char::is_numeric, Unicode 17 in
    tokenizers 0.23), for test_digits_classes: 'a' + c + 'a' splits in three."""
    d = pre_tokenizers.Digits(individual_digits=True)
    cps = [cp for cp in range(1, 0x110000) if not (0xD800 <= cp < 0xE000) and len(d.pre_tokenize_str("a" + chr(cp) + "a")) == 3]
    with open(os.path.join(FIX, "numeric.txt"), "w") as f:
        f.write("# code points (hex) that Hugging Face tokenizers' Digits pre-tokenizer splits off (char::is_numeric)\n")
        f.write("\n".join("%X" % c for c in cps) + "\n")
    print(f"  numeric.txt: {len(cps)} code points")


def chat_only():
    """--chat: the chat templates and prompts alone, into the fixtures already made"""
    for kind in CHAT_TEMPLATES:
        d = os.path.join(FIX, kind)
        write_config(d, kind)
        j = json.load(open(os.path.join(d, "cases.json"), encoding="utf-8"))
        j["chat"], j["templates"] = chat_cases(d, kind)
        with open(os.path.join(d, "cases.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        print(f"  {kind}: {len(j['chat'])} chat prompts")


def main():
    if sys.argv[1:] == ["--chat"]:
        return chat_only()
    numeric_list()
    corpus = build_corpus()
    print(f"corpus: {len(corpus.encode())} bytes")
    for kind in ("gemma", "mistral", "llama2", "smollm", "sp_odd", "sp_plain"):
        d = os.path.join(FIX, kind)
        os.makedirs(d, exist_ok=True)
        j = make_json(kind, corpus)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
        Tokenizer.from_file(os.path.join(d, "tokenizer.json"))  # HF must accept what we wrote
        write_config(d, kind)
        nc, nb, nu = make_cases(d, kind, corpus)
        print(f"  {kind}: vocab {len(j['model']['vocab'])}, merges {len(j['model']['merges'])}, added {len(j['added_tokens'])}; "
              f"{nc} strings, {nb} with byte-fallback tokens, {nu} with <unk>; cases.json "
              f"{os.path.getsize(os.path.join(d, 'cases.json')) // 1024} KB")


if __name__ == "__main__":
    main()
