//! Just enough of the kernel's BTF (`/sys/kernel/btf/vmlinux`) to find a
//! struct member's byte offset, for programs that read one kernel field
//! without CO-RE (aya 0.14 relocates maps, not field accesses in every
//! program type): the loader passes the offset in as a `.rodata` constant.
//!
//! Format: `Documentation/bpf/btf.rst` (header, type section, string section).

use thiserror::Error;

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not BTF (bad magic or header)")]
    BadHeader,
    #[error("BTF type section ends inside a type")]
    Truncated,
    #[error("BTF kind {0} is unknown to this parser")]
    UnknownKind(u32),
    #[error("no struct {0} in the kernel's BTF")]
    NoStruct(String),
    #[error("struct {0} has no member {1}")]
    NoMember(String, String),
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn name_at(strings: &[u8], off: u32) -> &[u8] {
    let rest = strings.get(off as usize..).unwrap_or(&[]);
    let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
    &rest[..end]
}

/// Bytes of kind-specific data after a type's 12-byte common part.
fn extra_len(kind: u32, vlen: usize) -> Result<usize, BtfError> {
    Ok(match kind {
        2 | 7..=12 | 16 | 18 => 0, // PTR, FWD, TYPEDEF..RESTRICT, FUNC, FLOAT, TYPE_TAG
        1 | 14 | 17 => 4,          // INT, VAR, DECL_TAG
        3 => 12,                   // ARRAY
        4 | 5 | 15 | 19 => 12 * vlen, // STRUCT, UNION, DATASEC, ENUM64
        6 | 13 => 8 * vlen,        // ENUM, FUNC_PROTO
        k => return Err(BtfError::UnknownKind(k)),
    })
}

/// Byte offset of `member` in the struct (or union) named `strukt`. Only
/// members directly in it; a bitfield member reports its containing byte.
pub fn member_offset(btf: &[u8], strukt: &str, member: &str) -> Result<u32, BtfError> {
    if u16_at(btf, 0) != Some(MAGIC) {
        return Err(BtfError::BadHeader);
    }
    let hdr_len = u32_at(btf, 4).ok_or(BtfError::BadHeader)? as usize;
    let (type_off, type_len, str_off, str_len) = (
        u32_at(btf, 8).ok_or(BtfError::BadHeader)? as usize,
        u32_at(btf, 12).ok_or(BtfError::BadHeader)? as usize,
        u32_at(btf, 16).ok_or(BtfError::BadHeader)? as usize,
        u32_at(btf, 20).ok_or(BtfError::BadHeader)? as usize,
    );
    let types = btf
        .get(hdr_len + type_off..hdr_len + type_off + type_len)
        .ok_or(BtfError::BadHeader)?;
    let strings = btf
        .get(hdr_len + str_off..hdr_len + str_off + str_len)
        .ok_or(BtfError::BadHeader)?;
    let mut at = 0;
    while at < types.len() {
        let name_off = u32_at(types, at).ok_or(BtfError::Truncated)?;
        let info = u32_at(types, at + 4).ok_or(BtfError::Truncated)?;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        let body = at + 12;
        let next = body + extra_len(kind, vlen)?;
        if next > types.len() {
            return Err(BtfError::Truncated);
        }
        if (kind == KIND_STRUCT || kind == KIND_UNION)
            && name_at(strings, name_off) == strukt.as_bytes()
        {
            let bitfields = info >> 31 == 1;
            for m in 0..vlen {
                let m_at = body + 12 * m;
                let m_name = u32_at(types, m_at).ok_or(BtfError::Truncated)?;
                if name_at(strings, m_name) == member.as_bytes() {
                    let raw = u32_at(types, m_at + 8).ok_or(BtfError::Truncated)?;
                    let bits = if bitfields { raw & 0x00ff_ffff } else { raw };
                    return Ok(bits / 8);
                }
            }
            return Err(BtfError::NoMember(strukt.to_owned(), member.to_owned()));
        }
        at = next;
    }
    Err(BtfError::NoStruct(strukt.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with one INT and `struct pair { int a; int b; }` (b at 4).
    fn sample() -> Vec<u8> {
        let strings = b"\0int\0pair\0a\0b\0";
        let mut types = Vec::new();
        // [1] INT "int" size 4, encoding word (signed, 32 bits).
        for v in [1u32, 1 << 24, 4, (1 << 24) | 32] {
            types.extend_from_slice(&v.to_le_bytes());
        }
        // [2] STRUCT "pair" vlen 2 size 8: a (type 1, bit 0), b (type 1, bit 32).
        for v in [5u32, (4 << 24) | 2, 8, 10, 1, 0, 12, 1, 32] {
            types.extend_from_slice(&v.to_le_bytes());
        }
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        b.extend_from_slice(&24u32.to_le_bytes());
        for v in [
            0u32,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&types);
        b.extend_from_slice(strings);
        b
    }

    #[test]
    fn finds_a_member_offset() {
        let b = sample();
        assert_eq!(member_offset(&b, "pair", "a"), Ok(0));
        assert_eq!(member_offset(&b, "pair", "b"), Ok(4));
        assert_eq!(
            member_offset(&b, "pair", "c"),
            Err(BtfError::NoMember("pair".into(), "c".into()))
        );
        assert_eq!(
            member_offset(&b, "other", "a"),
            Err(BtfError::NoStruct("other".into()))
        );
    }

    #[test]
    fn refuses_what_is_not_btf() {
        assert_eq!(member_offset(b"hello", "a", "b"), Err(BtfError::BadHeader));
        let mut b = sample();
        b.truncate(40);
        assert!(member_offset(&b, "pair", "b").is_err());
    }

    #[test]
    fn reads_the_running_kernels_sock_common() {
        let Ok(b) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipped: no kernel BTF");
            return;
        };
        // skc_family follows the address, hash and port unions; skc_cookie
        // (an atomic64_t) comes after it. Members inside anonymous unions
        // (skc_daddr) are out of this parser's reach, and say so. That the
        // offset is the right one is shown by tests/bypass.rs: the read
        // counter it feeds finds every paired socket.
        let family = member_offset(&b, "sock_common", "skc_family").expect("skc_family");
        let cookie = member_offset(&b, "sock_common", "skc_cookie").expect("skc_cookie");
        assert!(
            family >= 8 && cookie > family && cookie.is_multiple_of(8),
            "{family} {cookie}"
        );
        assert_eq!(
            member_offset(&b, "sock_common", "skc_daddr"),
            Err(BtfError::NoMember("sock_common".into(), "skc_daddr".into()))
        );
        assert_eq!(member_offset(&b, "sock", "__sk_common"), Ok(0));
    }
}
