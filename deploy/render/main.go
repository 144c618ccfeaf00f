// Command render renders deploy/chart/moat as `helm template` does, for
// machines where Helm cannot be installed (it is in neither Debian's
// packages, PyPI nor npm): the same template engine (Go's text/template
// with sprig's functions, as Helm uses them, env and expandenv removed),
// Helm's own additions this chart uses (include, toYaml, required,
// .Files.Get, .Release, .Chart, .Values), and values read as Helm reads
// them (YAML through JSON, numbers kept as json.Number). Built with Debian's
// golang-go, golang-github-masterminds-sprig-dev and
// golang-k8s-sigs-yaml-dev (GOPATH mode), so it needs nothing fetched.
//
// usage: render CHART_DIR RELEASE NAMESPACE [VALUES_FILE ...] > manifests.yaml
//
// With Helm at hand, `helm template RELEASE CHART_DIR -n NAMESPACE` gives
// the same documents (in Helm's install order rather than by file).
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"sigs.k8s.io/yaml"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "render: "+format+"\n", args...)
	os.Exit(1)
}

// readYAML reads a YAML file as Helm reads values: through JSON, numbers
// as json.Number.
func readYAML(path string) map[string]interface{} {
	data, err := os.ReadFile(path)
	if err != nil {
		fail("%v", err)
	}
	out := map[string]interface{}{}
	err = yaml.Unmarshal(data, &out, func(d *json.Decoder) *json.Decoder {
		d.UseNumber()
		return d
	})
	if err != nil {
		fail("%s: %v", path, err)
	}
	return out
}

// merge lays `over` on `base`, tables merged key by key, as `-f` does.
func merge(base, over map[string]interface{}) map[string]interface{} {
	for key, value := range over {
		if table, ok := value.(map[string]interface{}); ok {
			if under, ok := base[key].(map[string]interface{}); ok {
				base[key] = merge(under, table)
				continue
			}
		}
		base[key] = value
	}
	return base
}

// files is the chart's .Files: Get reads a file of the chart, following
// links.
type files struct{ root string }

func (f files) Get(name string) string {
	data, err := os.ReadFile(filepath.Join(f.root, name))
	if err != nil {
		fail(".Files.Get %q: %v", name, err)
	}
	return string(data)
}

func main() {
	if len(os.Args) < 4 {
		fail("usage: render CHART_DIR RELEASE NAMESPACE [VALUES_FILE ...]")
	}
	chartDir, release, namespace := os.Args[1], os.Args[2], os.Args[3]
	chart := readYAML(filepath.Join(chartDir, "Chart.yaml"))
	values := readYAML(filepath.Join(chartDir, "values.yaml"))
	for _, path := range os.Args[4:] {
		values = merge(values, readYAML(path))
	}
	top := map[string]interface{}{
		"Values": values,
		"Release": map[string]interface{}{
			"Name":      release,
			"Namespace": namespace,
			"Service":   "Helm",
		},
		"Chart": map[string]interface{}{
			"Name":       chart["name"],
			"Version":    chart["version"],
			"AppVersion": chart["appVersion"],
		},
		"Files": files{chartDir},
	}

	root := template.New("chart")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	funcs["toYaml"] = func(v interface{}) string {
		data, err := yaml.Marshal(v)
		if err != nil {
			return ""
		}
		return strings.TrimSuffix(string(data), "\n")
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var out bytes.Buffer
		err := root.ExecuteTemplate(&out, name, data)
		return out.String(), err
	}
	funcs["required"] = func(message string, value interface{}) (interface{}, error) {
		if value == nil || value == "" {
			return nil, fmt.Errorf("%s", message)
		}
		return value, nil
	}
	root.Funcs(funcs).Option("missingkey=zero")

	pattern := filepath.Join(chartDir, "templates", "*")
	paths, err := filepath.Glob(pattern)
	if err != nil {
		fail("%v", err)
	}
	sort.Strings(paths)
	name := fmt.Sprint(chart["name"])
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			fail("%v", err)
		}
		source := name + "/templates/" + filepath.Base(path)
		if _, err := root.New(source).Parse(string(data)); err != nil {
			fail("%v", err)
		}
	}
	for _, path := range paths {
		base := filepath.Base(path)
		if strings.HasPrefix(base, "_") || !strings.HasSuffix(base, ".yaml") {
			continue
		}
		source := name + "/templates/" + base
		var out bytes.Buffer
		if err := root.ExecuteTemplate(&out, source, top); err != nil {
			fail("%v", err)
		}
		// One document per `---`, each headed by its source, as Helm does.
		for _, document := range strings.Split(out.String(), "\n---\n") {
			if strings.TrimSpace(document) == "" {
				continue
			}
			fmt.Printf("---\n# Source: %s\n%s\n", source, strings.Trim(document, "\n"))
		}
	}
}
