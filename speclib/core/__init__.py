"""The decoding core: the protocols every LM, drafter and acceptor implements, sampling, lossless
acceptance, draft trees, the draft-then-verify loop (`generate`), the cost model and the device clock.
Nothing here imports from the rest of speclib."""
