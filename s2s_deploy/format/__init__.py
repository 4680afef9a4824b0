"""What an export folder is: specs, the manifest document, vocabularies, tokenizers and file writing. Torch-free."""
