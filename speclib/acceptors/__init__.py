"""Acceptors beyond the lossless rule (speclib.core.acceptance.Lossless): CoSpec's learned arbitration."""
