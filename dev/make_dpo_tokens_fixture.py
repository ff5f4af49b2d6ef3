#!/usr/bin/env python3
"""dev/make_dpo_tokens_fixture.py: the tokens TRL 1.16's DPOTrainer makes of conversational pairs.

Writes test/fixtures/dpo/chat_tokens.json: for each chat template of the tokenizer fixtures
(test/fixtures/tokenizer/<kind>: ChatML, Llama 3, Gemma, Mistral) and a few conversational pairs,
the prompt's, the chosen and the rejected completion's token ids as TRL 1.16's
DPOTrainer._prepare_dataset.tokenize_fn makes them: the prompt through apply_chat_template with the
generation prompt, prompt + completion through it without, and the completion everything after the
two's common prefix (common_prefix_length). So a completion ends as the template ends the
assistant's turn: ChatML's "<|im_end|>" and "\\n", Gemma's "<end_of_turn>" and "\\n", Llama 3's
"<|eot_id|>", Mistral's "</s>". TRL itself needs torch; these lines are its tokenize_fn with the same
transformers calls (trl/trainer/dpo_trainer.py, trl/data_utils.py _tokenize and
common_prefix_length, v1.16.0).

    python3 dev/make_dpo_tokens_fixture.py    # rewrites test/fixtures/dpo/chat_tokens.json
    make build/test_dpo_train && ./build/test_dpo_train

Needs transformers and jinja2 (no torch).
"""
import json
import os

from transformers import AutoTokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "fixtures")
KINDS = ["qwen2", "llama3", "gemma", "mistral"]
PAIRS = [
    (None, "What is 17+25?", "42", "It is 32."),
    ("Answer in one word.", "Name a colour of the sky.", "Blue.", "I like many colours, for example green and red."),
]


def tokenize(tok, messages, **kw):
    """trl.data_utils._tokenize for a conversation: apply_chat_template, tokenized, as a dict."""
    return tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kw)["input_ids"]


def common_prefix_length(ids, other_ids):
    length = 0
    for a, b in zip(ids, other_ids):
        if a != b:
            break
        length += 1
    return length


def tokenize_fn(tok, prompt, chosen, rejected):
    """TRL 1.16 DPOTrainer._prepare_dataset.tokenize_fn, conversational branch; and whether the
    prompt alone is a prefix of prompt + completion (where not, TRL warns and its completion holds
    the end of the prompt)."""
    prompt_ids = tokenize(tok, prompt, add_generation_prompt=True)
    prompt_chosen_ids = tokenize(tok, prompt + chosen)
    prompt_rejected_ids = tokenize(tok, prompt + rejected)
    prompt_len = min(common_prefix_length(prompt_ids, prompt_chosen_ids), common_prefix_length(prompt_ids, prompt_rejected_ids))
    return prompt_ids[:prompt_len], prompt_chosen_ids[prompt_len:], prompt_rejected_ids[prompt_len:], prompt_len == len(prompt_ids)


def main():
    out = {"made_by": "dev/make_dpo_tokens_fixture.py (TRL 1.16 DPOTrainer tokenize_fn)", "cases": []}
    for kind in KINDS:
        tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tokenizer", kind))
        for system, user, chosen, rejected in PAIRS:
            prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
            try:
                p, c, r, prefix = tokenize_fn(tok, prompt, [{"role": "assistant", "content": chosen}],
                                              [{"role": "assistant", "content": rejected}])
            except Exception as e:  # a template that refuses a system message (Gemma 1/2, Mistral v0.1)
                print(f"{kind}: {e.__class__.__name__}: skipped the pair with a system message")
                continue
            if not prefix:  # Mistral's system message moves with the last user turn: not a case to follow
                print(f"{kind}: the prompt is not a prefix of prompt + completion (TRL warns): skipped")
                continue
            out["cases"].append(dict(kind=kind, system=system, user=user, chosen=chosen, rejected=rejected, prompt_ids=p,
                                     chosen_ids=c, rejected_ids=r))
            print(kind, "completion:", tok.convert_ids_to_tokens(c))
    path = os.path.join(ROOT, "dpo", "chat_tokens.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {len(out['cases'])} pairs to {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
