"""Data: Grain sources and transforms, teacher-corpus generation, the demo tokenizer and the
bundled live-commerce assets. Trains nothing."""
