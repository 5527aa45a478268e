"""tunesmith: fine-tune and post-train language and vision-language models."""
__version__ = "0.1.0"
