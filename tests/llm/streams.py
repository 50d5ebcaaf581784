"""What the LLM backends' tests share."""
import asyncio

import pytest


async def cancel_after(stream, pieces: int) -> list:
    """Consume `stream` in a task and cancel it once `pieces` pieces arrived; the pieces received."""
    received = []

    async def consume():
        async for piece in stream:
            received.append(piece)

    task = asyncio.create_task(consume())
    while len(received) < pieces:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return received
