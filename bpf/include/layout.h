/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/*
 * Pins for the record layouts the Rust loaders mirror by hand (map keys and
 * values, ring buffer records): clang fails the build when a pinned size or
 * offset moves, and splitway-sys's test `bpf::layout::layout_pins_match_the_c`
 * reads these lines and holds the Rust side to the same numbers. One pin a
 * line, literal numbers only (the test parses them).
 */
#ifndef SPLITWAY_LAYOUT_H
#define SPLITWAY_LAYOUT_H

#define SW_PIN_SIZE(type, size) \
	_Static_assert(sizeof(struct type) == (size), \
		       "struct " #type ": size mirrored in Rust")
#define SW_PIN_OFFSET(type, member, offset) \
	_Static_assert(__builtin_offsetof(struct type, member) == (offset), \
		       "struct " #type "." #member ": offset mirrored in Rust")

#endif
