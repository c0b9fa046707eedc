"""How to build the client of one variant, the same in the parent and in every worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.client import DEFAULT_REQUEST_TIMEOUT
from harness.client.chat import ChatClient
from harness.client.raw import RawClient
from harness.client.response_limits import Limits


@dataclass(frozen=True)
class ClientSpec:
    """A ``ChatClient``'s settings (picklable); ``RawClient`` around it in raw mode."""

    base_url: str
    model: str
    api_key: str | None = None
    max_connections: int = 256
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    api: str = "chat"
    limits: Limits = field(default_factory=Limits)
    drop_bos: bool = False  # raw mode: the server adds its own BOS (raw.check_rendering)

    def chat_client(self) -> ChatClient:
        return ChatClient(
            self.base_url,
            model=self.model,
            api_key=self.api_key,
            max_connections=self.max_connections,
            request_timeout=self.request_timeout,
            limits=self.limits,
        )

    def sessions_client(self, client: ChatClient, dialect: str) -> Any:
        """The client as the sessions see it: the chat client, or raw mode around it."""
        if self.api == "chat":
            return client
        return RawClient(client, self.api, dialect, self.drop_bos)
