"""A radix tree over token ids: keys are token sequences, a node may hold a value (a kept entry id).

Edges carry runs of tokens (a node's children are keyed by their run's first token), so a lookup walks at most
one node per distinct kept prefix along the prompt. Pure CPU data.
"""
from __future__ import annotations

from collections.abc import Sequence


class _Node:
    __slots__ = ("edge", "children", "value", "parent")

    def __init__(self, edge: tuple[int, ...], parent: "_Node | None"):
        self.edge = edge
        self.children: dict[int, _Node] = {}
        self.value: int | None = None
        self.parent = parent


def _common(a: tuple[int, ...], b: Sequence[int], at: int) -> int:
    n = 0
    while n < len(a) and at + n < len(b) and a[n] == b[at + n]:
        n += 1
    return n


class RadixTree:
    def __init__(self) -> None:
        self.root = _Node((), None)
        self.size = 0

    def _find(self, key: Sequence[int]) -> _Node | None:
        node, at = self.root, 0
        while at < len(key):
            child = node.children.get(key[at])
            if child is None or _common(child.edge, key, at) != len(child.edge):
                return None
            node, at = child, at + len(child.edge)
        return node

    def insert(self, key: Sequence[int], value: int) -> int | None:
        """Set key's value; returns the value it replaces (None when there was none)."""
        node, at = self.root, 0
        key = tuple(key)
        while at < len(key):
            child = node.children.get(key[at])
            if child is None:
                leaf = _Node(key[at:], node)
                node.children[key[at]] = leaf
                node, at = leaf, len(key)
                break
            n = _common(child.edge, key, at)
            if n < len(child.edge):                          # split the edge where the key leaves it
                mid = _Node(child.edge[:n], node)
                node.children[key[at]] = mid
                child.edge, child.parent = child.edge[n:], mid
                mid.children[child.edge[0]] = child
                child = mid
            node, at = child, at + n
        old, node.value = node.value, value
        self.size += old is None
        return old

    def get(self, key: Sequence[int]) -> int | None:
        node = self._find(key)
        return None if node is None else node.value

    def remove(self, key: Sequence[int]) -> int | None:
        """Drop key's value (and nodes left empty); returns it."""
        node = self._find(key)
        if node is None or node.value is None:
            return None
        old, node.value = node.value, None
        self.size -= 1
        while node.parent is not None and node.value is None and not node.children:
            del node.parent.children[node.edge[0]]
            parent = node.parent
            if parent.parent is not None and parent.value is None and len(parent.children) == 1:
                (only,) = parent.children.values()             # merge a pass-through node into its child
                only.edge, only.parent = parent.edge + only.edge, parent.parent
                parent.parent.children[only.edge[0]] = only
                break
            node = parent
        return old

    def longest(self, key: Sequence[int], limit: int | None = None) -> tuple[int | None, int]:
        """(value, length) of the longest key with a value that is a prefix of `key`, at most `limit` long."""
        limit = len(key) if limit is None else min(limit, len(key))
        best, best_len = None, 0
        node, at = self.root, 0
        while True:
            if node.value is not None and at <= limit:
                best, best_len = node.value, at
            if at >= limit:
                break
            child = node.children.get(key[at])
            if child is None or _common(child.edge, key, at) != len(child.edge):
                break
            node, at = child, at + len(child.edge)
        return best, best_len

    def has_longer(self, key: Sequence[int]) -> bool:
        """Whether a value lies strictly below key (a longer key extends it)."""
        node, at = self.root, 0
        while at < len(key):
            child = node.children.get(key[at])
            n = 0 if child is None else _common(child.edge, key, at)
            if child is None or (n < len(child.edge) and at + n < len(key)):
                return False                                   # the key leaves the tree
            if n < len(child.edge):                            # the key ends inside this edge
                return self._holds(child)
            node, at = child, at + n
        return any(self._holds(c) for c in node.children.values())      # strictly below: not node's own value

    @staticmethod
    def _holds(node: _Node) -> bool:
        stack = [node]
        while stack:
            n = stack.pop()
            if n.value is not None:
                return True
            stack += n.children.values()
        return False
