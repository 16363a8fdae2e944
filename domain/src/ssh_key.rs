//! OpenSSH public keys people keep on their account, for the nodes of their dedicated
//! clusters: what Berth accepts, how it names a key (its SHA-256 fingerprint, as
//! `ssh-keygen -l` prints it) and the `authorized_keys` line it writes.
//!
//! A key is read whole, not trusted by its first word: the base64 must hold an SSH wire
//! blob of the named algorithm with nothing left over. Berth writes back only what it
//! parsed (algorithm, blob, a checked comment), so nothing a person pastes reaches a
//! node's `authorized_keys` as options or as a second line.

use data_encoding::{BASE64, BASE64_NOPAD};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Refusal;

/// The algorithms Berth accepts: those OpenSSH still offers by default. DSA is gone from
/// OpenSSH, RSA below 2048 bits is breakable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SshKeyAlgorithm {
    Ed25519,
    EcdsaP256,
    EcdsaP384,
    EcdsaP521,
    Rsa,
}

impl SshKeyAlgorithm {
    pub const ALL: [SshKeyAlgorithm; 5] = [
        SshKeyAlgorithm::Ed25519,
        SshKeyAlgorithm::EcdsaP256,
        SshKeyAlgorithm::EcdsaP384,
        SshKeyAlgorithm::EcdsaP521,
        SshKeyAlgorithm::Rsa,
    ];

    /// The name on the wire and at the start of the key's line.
    pub fn as_str(self) -> &'static str {
        match self {
            SshKeyAlgorithm::Ed25519 => "ssh-ed25519",
            SshKeyAlgorithm::EcdsaP256 => "ecdsa-sha2-nistp256",
            SshKeyAlgorithm::EcdsaP384 => "ecdsa-sha2-nistp384",
            SshKeyAlgorithm::EcdsaP521 => "ecdsa-sha2-nistp521",
            SshKeyAlgorithm::Rsa => "ssh-rsa",
        }
    }

    pub fn parse(name: &str) -> Option<SshKeyAlgorithm> {
        SshKeyAlgorithm::ALL.into_iter().find(|a| a.as_str() == name)
    }

    /// As `ssh-keygen -l` names it: `ED25519`, `ECDSA`, `RSA`.
    pub fn label(self) -> &'static str {
        match self {
            SshKeyAlgorithm::Ed25519 => "ED25519",
            SshKeyAlgorithm::EcdsaP256 | SshKeyAlgorithm::EcdsaP384 | SshKeyAlgorithm::EcdsaP521 => "ECDSA",
            SshKeyAlgorithm::Rsa => "RSA",
        }
    }
}

/// The fewest bits of an RSA key Berth accepts (NIST SP 800-131A; OpenSSH refuses fewer
/// than 1024 and warns below this).
pub const MIN_RSA_BITS: u32 = 2048;
/// Larger RSA keys are no stronger in practice and only slow every login down.
pub const MAX_RSA_BITS: u32 = 16_384;
/// The longest key line Berth reads (a 16384-bit RSA key is about 2.8 KB).
const MAX_KEY_TEXT: usize = 8 * 1024;
/// The longest comment (name) a key keeps.
pub const MAX_KEY_NAME: usize = 100;
/// How many keys one person may keep.
pub const MAX_KEYS_PER_USER: usize = 20;

/// A checked OpenSSH public key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshPublicKey {
    pub algorithm: SshKeyAlgorithm,
    /// The key's wire blob, base64 as OpenSSH writes it.
    pub blob: String,
    /// The key's size in bits (the curve's for ECDSA, the modulus' for RSA).
    pub bits: u32,
    /// `SHA256:` and the unpadded base64 of the blob's SHA-256, as `ssh-keygen -l` prints.
    pub fingerprint: String,
    /// The comment after the key (often `user@host`), empty when there was none.
    pub comment: String,
}

impl SshPublicKey {
    /// Reads one key as `ssh-keygen` writes it to a `.pub` file:
    /// `<algorithm> <base64> [comment]`.
    pub fn parse(text: &str) -> Result<SshPublicKey, Refusal> {
        let bad = |why: &str| Refusal::InvalidSshKey(why.to_owned());
        let text = text.trim();
        if text.is_empty() {
            return Err(bad("paste your public key, e.g. the contents of ~/.ssh/id_ed25519.pub"));
        }
        if text.len() > MAX_KEY_TEXT {
            return Err(bad("that is too long for one public key"));
        }
        if text.contains("PRIVATE KEY") {
            return Err(bad("this is a private key: never share it; paste the public key (the .pub file) instead"));
        }
        if text.starts_with("---- BEGIN SSH2 PUBLIC KEY") {
            return Err(bad("this key is in RFC 4716 format; convert it with ssh-keygen -i -f <file> and paste that"));
        }
        if text.contains(['\n', '\r']) {
            return Err(bad("paste one key on one line"));
        }
        let mut words = text.split_whitespace();
        let name = words.next().unwrap_or_default();
        let Some(algorithm) = SshKeyAlgorithm::parse(name) else {
            if name == "ssh-dss" {
                return Err(bad(
                    "DSA keys are no longer safe (and OpenSSH no longer accepts them); make an ed25519 key with ssh-keygen -t ed25519",
                ));
            }
            // An authorized_keys line with options starts with them.
            if name.contains('=') || name.contains(',') || text.contains(" ssh-") {
                return Err(bad("paste the key alone, without authorized_keys options"));
            }
            return Err(bad(&format!(
                "\"{}\" is not a key type Berth accepts; use ssh-ed25519, ecdsa-sha2-nistp256/384/521 or ssh-rsa (2048 bits or more)",
                name.chars().take(40).collect::<String>()
            )));
        };
        let encoded = words.next().ok_or_else(|| bad("the key's base64 part is missing after its type"))?;
        let comment = words.collect::<Vec<_>>().join(" ");
        let blob = BASE64.decode(encoded.as_bytes()).map_err(|_| bad("the key's base64 part is damaged"))?;
        let bits = read_blob(algorithm, &blob)?;
        Ok(SshPublicKey {
            algorithm,
            blob: BASE64.encode(&blob),
            bits,
            fingerprint: fingerprint(&blob),
            comment: checked_name(&comment)?,
        })
    }

    /// `<algorithm> <base64>`: the key itself, what makes two keys the same key.
    pub fn key_text(&self) -> String {
        format!("{} {}", self.algorithm.as_str(), self.blob)
    }

    /// The line for an `authorized_keys` file: no options, `comment` after the key.
    pub fn authorized_line(&self, comment: &str) -> String {
        let comment = checked_name(comment).unwrap_or_default();
        if comment.is_empty() { self.key_text() } else { format!("{} {comment}", self.key_text()) }
    }
}

/// A key's name (its comment, or what the person calls it): printable, one line, at most
/// [`MAX_KEY_NAME`] characters; surrounding and repeated spaces fold to one.
pub fn checked_name(name: &str) -> Result<String, Refusal> {
    let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
    if name.chars().any(char::is_control) {
        return Err(Refusal::InvalidSshKey("the key's name may hold no control characters".into()));
    }
    if name.chars().count() > MAX_KEY_NAME {
        return Err(Refusal::InvalidSshKey(format!("the key's name may be at most {MAX_KEY_NAME} characters")));
    }
    Ok(name)
}

/// `SHA256:…` of a key blob.
pub fn fingerprint(blob: &[u8]) -> String {
    format!("SHA256:{}", BASE64_NOPAD.encode(&Sha256::digest(blob)))
}

/// Checks the wire blob (RFC 4253 section 6.6, RFC 5656, RFC 8709) is a key of
/// `algorithm`; its size in bits.
fn read_blob(algorithm: SshKeyAlgorithm, blob: &[u8]) -> Result<u32, Refusal> {
    let damaged = || Refusal::InvalidSshKey("the key's data is damaged or cut short".into());
    let mut reader = WireReader { rest: blob };
    let named = reader.string().ok_or_else(damaged)?;
    if named != algorithm.as_str().as_bytes() {
        return Err(Refusal::InvalidSshKey(format!(
            "the key says it is {} but its data holds another kind of key",
            algorithm.as_str()
        )));
    }
    let bits = match algorithm {
        SshKeyAlgorithm::Ed25519 => {
            if reader.string().ok_or_else(damaged)?.len() != 32 {
                return Err(damaged());
            }
            256
        }
        SshKeyAlgorithm::EcdsaP256 | SshKeyAlgorithm::EcdsaP384 | SshKeyAlgorithm::EcdsaP521 => {
            let (curve, bits, point) = match algorithm {
                SshKeyAlgorithm::EcdsaP256 => ("nistp256", 256, 65),
                SshKeyAlgorithm::EcdsaP384 => ("nistp384", 384, 97),
                _ => ("nistp521", 521, 133),
            };
            if reader.string().ok_or_else(damaged)? != curve.as_bytes() {
                return Err(damaged());
            }
            // An uncompressed point: 0x04, then both coordinates.
            let q = reader.string().ok_or_else(damaged)?;
            if q.len() != point || q[0] != 4 {
                return Err(damaged());
            }
            bits
        }
        SshKeyAlgorithm::Rsa => {
            let exponent = positive_mpint(reader.string().ok_or_else(damaged)?).ok_or_else(damaged)?;
            let modulus = positive_mpint(reader.string().ok_or_else(damaged)?).ok_or_else(damaged)?;
            // An even exponent, or one of 1, is no RSA key.
            if exponent.last().is_none_or(|b| b & 1 == 0) || exponent == [1] {
                return Err(damaged());
            }
            let bits = u32::try_from(modulus.len() * 8).unwrap_or(u32::MAX) - modulus[0].leading_zeros();
            if bits < MIN_RSA_BITS {
                return Err(Refusal::InvalidSshKey(format!(
                    "this RSA key has {bits} bits; Berth needs at least {MIN_RSA_BITS} (better: ssh-keygen -t ed25519)"
                )));
            }
            if bits > MAX_RSA_BITS {
                return Err(Refusal::InvalidSshKey(format!("RSA keys may have at most {MAX_RSA_BITS} bits")));
            }
            bits
        }
    };
    if !reader.rest.is_empty() {
        return Err(damaged());
    }
    Ok(bits)
}

/// The magnitude of a positive SSH `mpint` without its leading zeros; `None` for zero or
/// a negative number.
fn positive_mpint(bytes: &[u8]) -> Option<&[u8]> {
    if bytes.first().is_some_and(|b| b & 0x80 != 0) {
        return None;
    }
    let start = bytes.iter().position(|b| *b != 0)?;
    Some(&bytes[start..])
}

/// Reads the length-prefixed strings of an SSH wire blob.
struct WireReader<'a> {
    rest: &'a [u8],
}

impl<'a> WireReader<'a> {
    fn string(&mut self) -> Option<&'a [u8]> {
        let (length, rest) = self.rest.split_first_chunk::<4>()?;
        let length = usize::try_from(u32::from_be_bytes(*length)).ok()?;
        if rest.len() < length {
            return None;
        }
        let (value, rest) = rest.split_at(length);
        self.rest = rest;
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Made with `ssh-keygen -t <type> -C ada@laptop`; fingerprints from `ssh-keygen -l`.
    const ED25519: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKzNtyR4cmJGDog7LEjOcX9o3mjUze+WPw53Rf+R08s7 ada@laptop";
    const P256: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBM3LPjfmplX56nT4Pq0/ydNnPEtHzpGtNw/E8x2ug+Y9TAbEkQa9mMzvCcpz1JpaTSxlpgJICzFwO9o6AWHNsO0= ada@laptop";
    const P384: &str = "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBPfdhckwhfmmLKpinKRtRJcMOkYJukx8SOkpFzuPiXSJjO8M0C0/6OgwuWxVuQ0whsp6UNhN14Mnzsy9cprsTarg2AXPvlhZ9DXJdp3PfKX+sKfv1lwiZPXqfUHM7YpUTQ== ada@laptop";
    const P521: &str = "ecdsa-sha2-nistp521 AAAAE2VjZHNhLXNoYTItbmlzdHA1MjEAAAAIbmlzdHA1MjEAAACFBADakYzbedkdpcBgjBewtNmtviggPcchlwj+mbdQFrA8Bq/goXacYx53YOg2xP53L5bdTkLNlA2PIVRAwT/pewhgEgB5Jpca+CSkYKADBgBv/x2pLy+dCR1FykiLRm7vM8MWDGnNrx5GHUxFSnObfQ6/4I08ne2zBiu16WcffduRUZetGg== ada@laptop";
    const RSA_2048: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQChu78UnMrqj8zQpeLcoF8xG+jm7e0BMAk9oCF1qwxPeUbrwJvne1SedJO4/HtCksY4fFM7lC24YngQBf5qjWCTyVNbX4OLZzkcF+Zi3XoGRfuPoIEzj+zjXDx3rRowa+CEJrCHOCdd/jYuoOaQGcBJQbLHmUkeCwMkzDwI/1KHLFRWv1hZMypAwy0OEur2TZqWx+1mbkgX7y6E61xeBb/uZLbZ9TdMMUodkj7UQWLqZ/LnpbEUSDx/dTDjF9hrF/rgRjl0nLu0GYK8M8nGYG7MfrkhdEG3MhH70sTDzhBCK6wtUXdsf9GmvG++HlJr6cXN1OQdOthbfgyRwIzewD6H ada@laptop";
    const RSA_1024: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDVfQrgWypELEnynZ/EQ4w9FAuc5kj+KLKI8qDK3yGYeoG95++8IyseTkUE6aIxUbhd71fBK8RDoTwjultu5FnJN1sYXDYP+bglokf9x3gpwgqra1pCJY+UF/mGuufhxn+AQcu6V7H5qysAU06/9HMzTcmmA0DCqOVAKBvA4YtUWw== ada@laptop";
    const DSA: &str = "ssh-dss AAAAB3NzaC1kc3MAAACBAOq8Wt9NYVXbYVu0tuujjP1F21wUqn23vJGsaAGWRsS03XeVJC0/xUiQVfvJbhhlyKeTCQWzZgjJ88r2KZzBoZQsiHvbJF+oKFq8hVWI/xiwEuBB7E7BAmcB/AMGCTuk8/KzoVjkFgxB6t7psQHdDPVnSqMjh0yj1vKeZ3SCFLdtAAAAFQC5G+uBeGFZAez/LZFcb2BmJ8NoCwAAAIBP7X6gHWkOkS3RhsVS9lX45eUBtuP0jS1BbrFZ4Z2XMXIuRM7y6oEHG94QRGM6o0zoSLktB3YeDIT0+qzvV0vmbWWqvBpxVkjAtvPaQfPTdfT96S2YmmAPAGipUIYZI5p5JrccBgNy6dLsHGGuyGPXtXUubh40h19ngcXtBWO7/AAAAIBfc4AVpasysEsvrYpNtUencbyn1815VMr61JrsC37c7Z88AVZV6FUOsovKBgtt1GoYDG7E/DoIXe22KZTfgZnuAWWmNdvTW4OX/94a2gmHduh/8Mmm+vHEFqoZ48Kc+2WnW/RK99u/kwc4SbpqGpuns01yvwHvaFswEZbiaOdRpw== ada@laptop";

    fn refusal(text: &str) -> String {
        SshPublicKey::parse(text).expect_err("refused").to_string()
    }

    #[test]
    fn every_accepted_kind_reads_with_ssh_keygens_fingerprint() {
        for (text, algorithm, bits, fingerprint) in [
            (ED25519, SshKeyAlgorithm::Ed25519, 256, "SHA256:Q9LDPLeW+BGJfnAedLLd6G8cdv5eY+N0OaIbpR8yFwk"),
            (P256, SshKeyAlgorithm::EcdsaP256, 256, "SHA256:JWfnZ6zkwptlf32aV1hOqLrZsQyl/loyJux0SNAIY7w"),
            (P384, SshKeyAlgorithm::EcdsaP384, 384, "SHA256:soLGtg+9lRxHEH0hw6tLodwt4qK13xDqq/jpL/G6mQs"),
            (P521, SshKeyAlgorithm::EcdsaP521, 521, "SHA256:rF3qkWKrkwF9RCOGi9CZpNrN08J0/QIgCioBLFAXExQ"),
            (RSA_2048, SshKeyAlgorithm::Rsa, 2048, "SHA256:aFag0S1orHb6tqGXKskLjXnLSsA2FBIbXX2xVZou99A"),
        ] {
            let key = SshPublicKey::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((key.algorithm, key.bits, key.fingerprint.as_str()), (algorithm, bits, fingerprint));
            assert_eq!(key.comment, "ada@laptop");
            assert_eq!(key.authorized_line("ada@laptop"), text, "written back as read");
        }
    }

    #[test]
    fn whitespace_around_and_inside_is_forgiven_and_the_comment_is_optional() {
        let key = SshPublicKey::parse(&format!("  {}  \n", ED25519.replace(' ', "   "))).expect("key");
        assert_eq!(key.comment, "ada@laptop");
        let bare = SshPublicKey::parse(ED25519.trim_end_matches(" ada@laptop")).expect("no comment");
        assert_eq!(bare.comment, "");
        assert_eq!(bare.authorized_line(""), ED25519.trim_end_matches(" ada@laptop"));
        assert_eq!(bare.key_text(), key.key_text());
        let spaced = SshPublicKey::parse(&format!("{ED25519} work laptop")).expect("long comment");
        assert_eq!(spaced.comment, "ada@laptop work laptop");
    }

    #[test]
    fn weak_old_and_wrong_things_are_refused_with_what_to_do() {
        assert!(refusal(RSA_1024).contains("this RSA key has 1024 bits; Berth needs at least 2048"));
        assert!(refusal(DSA).contains("DSA keys are no longer safe"));
        assert!(refusal("").contains("paste your public key"));
        assert!(
            refusal("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n")
                .contains("this is a private key")
        );
        assert!(refusal(&format!("{ED25519}\n{P256}")).contains("one key on one line"));
        assert!(refusal(&format!("command=\"rm -rf /\" {ED25519}")).contains("without authorized_keys options"));
        assert!(refusal(&format!("no-pty,from=\"*\" {ED25519}")).contains("without authorized_keys options"));
        assert!(refusal("ssh-ed25519").contains("base64 part is missing"));
        assert!(refusal("ssh-ed25519 not*base64").contains("base64 part is damaged"));
        assert!(refusal("ssh-foo AAAA").contains("\"ssh-foo\" is not a key type Berth accepts"));
        assert_eq!(
            refusal(&ED25519.replace("ssh-ed25519", "ssh-rsa")),
            "SSH key: the key says it is ssh-rsa but its data holds another kind of key"
        );
    }

    #[test]
    fn blobs_cut_short_or_with_bytes_left_over_are_damaged() {
        let blob = BASE64.decode(ED25519.split(' ').nth(1).expect("blob").as_bytes()).expect("base64");
        for broken in [blob[..blob.len() - 1].to_vec(), [blob.as_slice(), &[0]].concat(), blob[..10].to_vec()] {
            let text = format!("ssh-ed25519 {}", BASE64.encode(&broken));
            assert_eq!(refusal(&text), "SSH key: the key's data is damaged or cut short");
        }
        // A length prefix that claims more than is there.
        let mut lying = blob.clone();
        lying[3] = 0xff;
        assert!(refusal(&format!("ssh-ed25519 {}", BASE64.encode(&lying))).contains("damaged"));
        // An ECDSA key whose curve does not match its name.
        let p384 = P384.split(' ').nth(1).expect("blob");
        assert!(refusal(&format!("ecdsa-sha2-nistp256 {p384}")).contains("another kind of key"));
    }

    #[test]
    fn names_are_one_printable_line() {
        assert_eq!(checked_name("  my   laptop "), Ok("my laptop".to_owned()));
        assert!(checked_name("a\u{7}b").is_err());
        assert!(checked_name(&"x".repeat(MAX_KEY_NAME + 1)).is_err());
        // A name that cannot be written is left off the line rather than breaking it.
        let key = SshPublicKey::parse(ED25519).expect("key");
        assert_eq!(key.authorized_line("a\u{1b}[31m"), key.key_text());
    }
}
