"""Text to batches: ``sources`` (files, folders, the Hub, builtin corpora; splits; the tokenized
cache), ``tasks`` (generated tasks: copy, reverse, addition), ``tokenizer`` (char, byte, BPE)
and ``batches`` (packed and padded batches with their key and loss masks)."""
