"""Several drafts of one request merged into a token tree, verified in one row.

Fastest-of-N racing gives a tail request more than one drafter; their drafts
often share a prefix. Merging them into a trie and flattening it (the first
draft is laid out first, as a plain chain, so the common case needs no KV
compaction) lets one forward score every candidate: each node attends to its
ancestors only (``StepLayout`` builds that mask) and sits at position
start + depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)  # node i's token (the root, the last committed token, excluded)
    parents: list[int] = field(default_factory=list)  # node i's parent node, -1 = the root
    children: list[dict[int, int]] = field(default_factory=lambda: [{}])  # [0] = root's, then node i+1's

    @classmethod
    def build(cls, drafts: list[list[int]]) -> "DraftTree":
        tree = cls()
        for draft in drafts:
            node = -1
            for token in draft:
                child = tree.children[node + 1].get(token)
                if child is None:
                    child = len(tree.tokens)
                    tree.tokens.append(token)
                    tree.parents.append(node)
                    tree.children.append({})
                    tree.children[node + 1][token] = child
                node = child
        return tree

    def walk(self, target_at: "list[int]") -> list[int]:
        """Nodes accepted when the target's own token after node i is ``target_at[i+1]``
        (``target_at[0]`` after the root): follow matching children from the root."""
        path: list[int] = []
        node = -1
        while True:
            child = self.children[node + 1].get(target_at[node + 1])
            if child is None:
                return path
            path.append(child)
            node = child

    def depth(self, node: int) -> int:
        d = 0
        while node >= 0:
            node = self.parents[node]
            d += 1
        return d


def matched(draft: list[int], committed: list[int]) -> int:
    """How many leading tokens of ``draft`` the verifier committed."""
    n = 0
    for a, b in zip(draft, committed):
        if a != b:
            break
        n += 1
    return n
