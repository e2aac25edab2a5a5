"""Tokenizer and chat template without importing transformers (fast start-up).

Reads ``tokenizer.json`` with the ``tokenizers`` library and renders the chat
template from ``tokenizer_config.json`` in a sandboxed jinja2 environment, as
transformers does.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer


class Tokenizer:
    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: the model folder has no fast tokenizer")
        self._tok = _HFTokenizer.from_file(str(path))
        config_path = folder / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
        self.chat_template: str | None = self.config.get("chat_template")
        if self.chat_template is None and (folder / "chat_template.jinja").exists():
            self.chat_template = (folder / "chat_template.jinja").read_text()

    def _special(self, key: str) -> str | None:
        value = self.config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return value

    @property
    def eos_token_id(self) -> int | None:
        token = self._special("eos_token")
        return None if token is None else self._tok.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    @cached_property
    def _template(self) -> Any:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ValueError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template or "")

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of ``messages`` with the generation prompt appended."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template; give prompt_ids or plain prompts")
        text = self._template.render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=self._special("bos_token") or "",
            eos_token=self._special("eos_token") or "",
        )
        return self.encode(text)
