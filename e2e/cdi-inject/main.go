// tessera-cdi-inject: the reference CDI library (tags.cncf.io/container-device-interface,
// the code containerd and CRI-O run) loads the CDI specs of a directory and injects the
// named devices into an empty OCI runtime spec, which it prints as JSON. Loading is
// strict, as in a runtime: a spec the library refuses, or a device it cannot resolve, is
// an error here too.
//
//	tessera-cdi-inject --spec-dir DIR [--base FILE] DEVICE...
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	dir := flag.String("spec-dir", "", "directory of CDI specs")
	base := flag.String("base", "", "OCI runtime spec to inject into (default: an empty one)")
	flag.Parse()
	if *dir == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: tessera-cdi-inject --spec-dir DIR [--base FILE] DEVICE...")
		os.Exit(2)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(*dir), cdi.WithAutoRefresh(false))
	if err != nil {
		fail("loading %s: %v", *dir, err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		paths := make([]string, 0, len(errs))
		for p := range errs {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		for _, p := range paths {
			for _, e := range errs[p] {
				fmt.Fprintf(os.Stderr, "%s: %v\n", p, e)
			}
		}
		os.Exit(1)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if *base != "" {
		text, err := os.ReadFile(*base)
		if err != nil {
			fail("reading %s: %v", *base, err)
		}
		if err := json.Unmarshal(text, spec); err != nil {
			fail("parsing %s: %v", *base, err)
		}
	}
	unresolved, err := cache.InjectDevices(spec, flag.Args()...)
	if err != nil {
		fail("injecting %v (unresolved %v): %v", flag.Args(), unresolved, err)
	}
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(spec); err != nil {
		fail("writing the spec: %v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}
