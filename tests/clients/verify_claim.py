"""A claim verifier independent of Moat: what a third party writes to check
a claim of `moat serve --claims` with the signer's public key alone.

    python3 verify_claim.py CLAIM PUBLIC_KEY_HEX

Prints `ok SESSION` and exits 0 when the signature holds; otherwise prints
why and exits 1 (2 for a claim Moat left unsigned).
"""

import json
import sys

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


def main(path, public_hex):
    with open(path, encoding="utf-8") as f:
        document = json.load(f)
    claim = document["claim"]
    if claim.get("format") != "moat-claim/1":
        print("not a claim: format %r" % claim.get("format"))
        return 1
    signature = document["signature"]
    if signature is None:
        print("unsigned: " + "; ".join(document["claim"]["incomplete"]))
        return 2
    if signature["algorithm"] != "ed25519" or signature["public_key"] != public_hex:
        print("signed by another key: " + signature["public_key"])
        return 1
    if claim["incomplete"]:
        print("a signed claim that names its record incomplete")
        return 1
    # The format, a newline, then the canonical encoding: keys sorted at
    # every level, no spaces.
    message = b"moat-claim/1\n" + json.dumps(
        claim, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")
    key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_hex))
    try:
        key.verify(bytes.fromhex(signature["value"]), message)
    except InvalidSignature:
        print("bad signature")
        return 1
    print("ok " + claim["session"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
