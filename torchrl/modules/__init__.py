"""torchrl.modules: only the LLM interop (``torchrl.modules.llm``) lives here."""
