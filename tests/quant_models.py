"""Tiny random-weight BERT and Llama models (and their tokenizer-free inputs) for quantization tests."""

from __future__ import annotations

import torch


def tiny_bert(seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=64)
    return transformers.BertModel(cfg, add_pooling_layer=False).eval()


def tiny_llama(seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                                   architectures=["LlamaForCausalLM"])
    return transformers.LlamaForCausalLM(cfg).eval()


def token_batch(n: int = 8, seq: int = 12, seed: int = 0, vocab: int = 1024) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, seq), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def save_tiny_bert(folder, seed: int = 0):
    """A tiny BERT (hidden 96) with a word-level tokenizer, saved as a Hugging Face folder."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(seed)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + [f"w{i}" for i in range(60)] + \
        "the a of to and in is it that was for on are with as he be at by this".split()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                                cls_token="[CLS]", sep_token="[SEP]")
    cfg = transformers.BertConfig(vocab_size=len(words), hidden_size=96, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=192, max_position_embeddings=128, architectures=["BertModel"])
    transformers.BertModel(cfg, add_pooling_layer=False).eval().save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder
