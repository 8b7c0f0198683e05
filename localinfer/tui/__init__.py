"""The chat app (`localinfer chat`): a thin Textual client of the Engine, with its chats in SQLite."""
