"""Ray Train's Hugging Face integrations (``ray.train.huggingface``) on trainyard:
``trainyard.train.huggingface.transformers``."""
