"""Target models: resolving an alias, folder, GGUF file or Hub id; tokenizers and chat templates;
Hydra model presets written from a model folder."""
