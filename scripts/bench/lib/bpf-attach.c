// bpf-attach OBJECT: loads a BPF object with libbpf, attaches every program
// (by its section name), prints "attached" and holds the links until stdin
// closes. For the measurement scripts only (scripts/bench/bypass-floor.sh).
#include <bpf/libbpf.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s OBJECT\n", argv[0]);
		return 2;
	}
	struct bpf_object *obj = bpf_object__open_file(argv[1], NULL);
	if (!obj || bpf_object__load(obj)) {
		fprintf(stderr, "bpf-attach: loading %s failed\n", argv[1]);
		return 1;
	}
	struct bpf_program *prog;
	bpf_object__for_each_program(prog, obj) {
		if (!bpf_program__attach(prog)) {
			fprintf(stderr, "bpf-attach: attaching %s failed\n", bpf_program__name(prog));
			return 1;
		}
	}
	printf("attached\n");
	fflush(stdout);
	while (getchar() != EOF) {
	}
	return 0;
}
