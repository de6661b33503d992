"""Mamba prefix caching in the hybrid allocator: vLLM 0.33's "align" Mamba cache mode, a mixin of
`HybridAllocator` (kvsim/alloc/hybrid/allocator.py); the rules of such a group are
kvsim/alloc/hybrid/groups.py `MambaAlignRules`, its retention kvsim/alloc/hybrid/retention.py `mamba_mask`.

vLLM 0.33 runs a Mamba group in "align" mode whenever prefix caching is on (`MambaModelConfig.
verify_and_update_config`, vllm/model_executor/models/config.py; its `--mamba-cache-mode` flag is
deprecated and has no effect: the mode follows `--enable-prefix-caching`) with Mamba blocks of the
attention block size. A state is written only at the end of a step's chunk, so the scheduler ends every
prefill chunk that does not finish the prefill on a block boundary, and stops a chunk at the last block
boundary before the prompt's last token and at a shared-prefix junction, so those states exist to be cached
(`Scheduler._mamba_block_aligned_split`, vllm/v1/core/sched/scheduler.py: `clip_chunk` here, which the
kvsim scheduler asks when the allocator has it). A state cached in the current step cannot serve a hit in
the same step (`MambaManager.get_num_blocks_to_allocate` asks for more blocks than the pool has: the
request waits for the next step; `new_step` marks a step's start).

Mamba layers that export a state from inside a prefill chunk (`mamba_checkpoints`: vLLM's Mamba-2 mixer
declares one prefill checkpoint block, alignment 1, `MambaMixer2.get_kv_cache_spec`) change two things: the
scheduler keeps a prompt's last chunk whole when the checkpoint at its last block boundary falls inside it
(`is_mamba_prefill_checkpoint_valid`), and a growth that holds such a checkpoint takes two blocks, the
checkpoint's entry and the running state's (`_needs_internal_checkpoint`; at retention 0 only the chunk
reaching the prefill end, else every chunk spanning two blocks). Mamba-1 mixers (Jamba) and the gated delta
net on its Triton prefill kernel (Qwen3-Next on A100) export none. Not modelled: the gated delta net on
FlashInfer's prefill kernel (vLLM's default on Hopper), whose checkpoints also need 64-token aligned blocks
(it then raises the block size to a multiple of 64); EAGLE / MTP blocks, hash blocks finer than the Mamba
block (partial-tail hits), `--enable-mamba-shared-prefix-checkpoint`, `--long-prefill-token-threshold`
(off by default in vLLM).
"""

from __future__ import annotations

from kvsim.alloc.hybrid.groups import NULL_BLOCK


class HybridMamba:
    """`clip_chunk`, `new_step` and the table growth (`_extend`) of `HybridAllocator`."""

    def _mamba_init(self) -> None:
        """Set `clip_chunk` / `new_step` (None unless a group runs in align mode) and the step's fresh states."""
        align = any(r.one_block for r in self.rules)
        self.clip_chunk = self._clip_chunk if align else None
        self.new_step = self._fresh.clear if align else None
        if align:
            self.can_tick = False     # (the scheduler runs vLLM's running loop in order: no lazy decode ticks)

    _fresh: set   # align mode: the (hash, group) keys of Mamba states cached during the current step

    mamba_checkpoints = False   # Mamba layers export a state from inside a prefill chunk (Mamba-2's spec)

    def _extend(self, table: list[int], g: int, rules, more: int, ckpt: bool = False) -> None:
        """Grow group `g`'s `table` by `more` (> 0) entries: blocks from the pool, or (a Mamba group in
        align mode) nulls then one block at the last entry, two with a prefill checkpoint (`ckpt`)."""
        if rules.one_block:
            real = 2 if ckpt else 1
            table.extend([NULL_BLOCK] * (more - real))
            self._nulls[g] += more - real
            more = real
        table.extend(self._take(more))
        self._held[g] += more

    def _checkpoint(self, start: int, end: int, prefill_end: int) -> bool:
        """Whether a growth from `start` to `end` computed tokens holds a prefill checkpoint block (vLLM's
        `MambaManager._needs_internal_checkpoint` with `is_mamba_prefill_checkpoint_valid`, alignment 1;
        `prefill_end` counts only at retention 0, as `KVCacheCoordinator.get_num_blocks_to_allocate`)."""
        if not self.mamba_checkpoints or (self.retention_interval == 0 and end < prefill_end):
            return False
        bs = self.block_size
        ckpt = max((end - 1) // bs * bs, 0)
        return (start % bs == 0 and -(-end // bs) - 2 > (start - 1) // bs and start + bs <= ckpt
                and start < ckpt < end)

    def _prefill_end(self, seq_id, num_tokens: int) -> int:
        """vLLM's prefill end of a request admitted with `num_tokens` (max(prompt, tokens - 1): a recompute
        replays its outputs); its prompt is its first admission's tokens."""
        prompt = self._prompts.get(seq_id)
        return num_tokens if prompt is None else max(prompt, num_tokens - 1)

    def _fresh_hit(self, tables: list[list[int]]) -> bool:
        """Whether a Mamba hit's state block was cached in this step (vLLM defers such a request)."""
        fresh, key = self._fresh, self._cache.cached_hash
        return any(self.rules[g].one_block and t and key(t[-1]) in fresh for g, t in enumerate(tables))

    def _clip_chunk(self, seq_id: int | None, start: int, chunk: int, prompt: int, num_tokens: int,
                    max_chunk: int) -> int:
        """The tokens of a prefill chunk of at most `chunk` tokens from `start` computed tokens that vLLM
        schedules in align mode (0: none this step; `Scheduler._mamba_block_aligned_split`) for a request
        of `prompt` prompt tokens holding `num_tokens` (prompt + generated: a recompute replays its
        outputs); `seq_id` None: the request being admitted (its junction from the last `find_hits`).
        `max_chunk`: the step's token budget (max_num_batched_tokens)."""
        prefill_end = max(prompt, num_tokens - 1)
        if start >= prefill_end:
            return chunk
        bs, end = self.block_size, start + chunk
        last_cache = (num_tokens - 1) // bs * bs
        ckpt = max((prefill_end - 1) // bs * bs, 0)     # (the scheduler's checkpoint: at its prefill end)
        internal = (self.mamba_checkpoints and end >= prefill_end and start % bs == 0
                    and -(-end // bs) - 2 > (start - 1) // bs and start + bs <= ckpt and start < ckpt < end)
        if internal:
            last_cache = 0              # (the chunk exports it from inside: no cut at the last boundary)
        if end < prefill_end:
            aligned = end // bs * bs
            if aligned > start or bs <= max_chunk:
                end = aligned
        junction = self._junction if seq_id is None else self._seq(seq_id).junction
        floored = start + (junction - start) // bs * bs
        stops = (start // bs * bs + bs if start % bs and not internal else 0, last_cache,
                 floored if start < junction < end else 0)
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)
