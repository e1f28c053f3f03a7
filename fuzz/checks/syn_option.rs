//! Destination TCP option: parsing an arbitrary saved SYN or option list never
//! panics; a decoded option re-encodes to exactly its bytes (one encoding per
//! destination); an option built from the input, placed in a SYN after
//! Linux's usual options, is found again and resolves to its destination;
//! the SYN's own destination (TPROXY's original one) is read back too.
//!
//! Shared by the cargo-fuzz target and the stable corpus replay test.

use std::net::{Ipv6Addr, SocketAddrV4, SocketAddrV6};

use splitway_proto::syn_option::{self, SynOption, find_in_options, find_in_syn};

/// Panics if `data` breaks a property above.
pub fn check(data: &[u8]) {
    let _ = find_in_syn(data);
    if let Some(dst) = syn_option::syn_destination(data) {
        assert_ne!(dst.port(), 0, "port 0 is no destination");
    }
    if let Ok(Some(option)) = find_in_options(data) {
        let mut wire = Vec::new();
        option.encode(&mut wire);
        assert!(
            data.windows(wire.len()).any(|w| w == wire.as_slice()),
            "decoded option does not re-encode to bytes of the input"
        );
    }
    if data.len() >= 4
        && data[0] == syn_option::KIND
        && data[1] as usize == data.len()
        && let Ok(Some(option)) = SynOption::decode(data)
    {
        let mut wire = Vec::new();
        option.encode(&mut wire);
        assert_eq!(wire, data);
    }
    let Some((fixed, rest)) = data.split_at_checked(19) else {
        return;
    };
    let port = u16::from_be_bytes([fixed[16], fixed[17]]).max(1);
    let octets: [u8; 16] = fixed[..16].try_into().expect("16 bytes");
    let (option, want) = match fixed[18] % 3 {
        0 => {
            let a = SocketAddrV4::new([octets[0], octets[1], octets[2], octets[3]].into(), port);
            (SynOption::V4(a), a.into())
        }
        1 => {
            let a = SocketAddrV6::new(octets.into(), port, 0, 0);
            (SynOption::V6(a), a.into())
        }
        _ => {
            // Prefix = the address with its host bits cleared: always inside.
            // /32..=/127: the lengths whose indexed option exists.
            let len = rest.first().map_or(64, |b| 32 + b % 96);
            let mask = u128::MAX.checked_shl(128 - len as u32).unwrap_or(0);
            let prefix = Ipv6Addr::from(u128::from_be_bytes(octets) & mask);
            let a = SocketAddrV6::new(octets.into(), port, 0, 0);
            let index = fixed[18] & 0x7f;
            let option = SynOption::v6_indexed(index, prefix, len, a)
                .expect("index below 128")
                .expect("a prefix of /32 or longer fits");
            let table = move |i: u8| (i == index).then_some((prefix, len));
            assert_eq!(option.resolve(&table), Ok(a.into()));
            (option, a.into())
        }
    };
    // MSS, SACK-permitted + timestamps, NOP + window scale: Linux's 20 bytes;
    // the full IPv6 form fits only without timestamps.
    let mut options = if option.encoded_len() <= 20 {
        vec![
            2, 4, 5, 180, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
        ]
    } else {
        vec![2, 4, 5, 180, 1, 1, 4, 2, 1, 3, 3, 7]
    };
    option.encode(&mut options);
    while options.len() % 4 != 0 {
        options.push(1);
    }
    let mut syn = vec![
        0x45, 0, 0, 0, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];
    let mut tcp = [0u8; 20];
    tcp[12] = ((20 + options.len()) / 4) as u8 * 16;
    tcp[13] = 0x02;
    tcp[2..4].copy_from_slice(&port.to_be_bytes());
    syn.extend_from_slice(&tcp);
    syn.extend_from_slice(&options);
    assert_eq!(find_in_syn(&syn), Ok(Some(option)));
    assert_eq!(
        syn_option::syn_destination(&syn),
        Some(SocketAddrV4::new([10, 0, 0, 2].into(), port).into())
    );
    if let SynOption::V4(_) | SynOption::V6(_) = option {
        assert_eq!(option.resolve(&|_| None), Ok(want));
    }
}
