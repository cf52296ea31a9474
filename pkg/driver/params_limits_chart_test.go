package driver

import (
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// TestLimitKeysInChartSchema ties the chart's values.schema.json to the limit and rate
// parsers: the StorageClass's parameters and each VolumeAttributesClass's parameters list
// exactly the limit keys, a count key with the count pattern and a byte key with the byte
// pattern, exactly the rate keys with the rate pattern and the scrub keys each with its
// definition, and every value those patterns
// let through is one the parser takes (so helm refuses what CreateVolume or
// ControllerModifyVolume would refuse, never the other way round).
func TestLimitKeysInChartSchema(t *testing.T) {
	raw, err := os.ReadFile("../../charts/raid10-csi/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	type prop struct {
		Ref     string `json:"$ref"`
		Pattern string `json:"pattern"`
	}
	var s struct {
		Definitions map[string]prop `json:"definitions"`
		Properties  struct {
			StorageClass struct {
				Properties struct {
					Parameters struct {
						Properties map[string]prop `json:"properties"`
					} `json:"parameters"`
				} `json:"properties"`
			} `json:"storageClass"`
			VolumeAttributesClasses struct {
				Items struct {
					Properties struct {
						Parameters struct {
							Properties map[string]prop `json:"properties"`
						} `json:"parameters"`
					} `json:"properties"`
				} `json:"items"`
			} `json:"volumeAttributesClasses"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	refs := map[bool]string{false: "#/definitions/qosCount", true: "#/definitions/qosBytes"}
	const rateRef = "#/definitions/rateBytes"
	for where, props := range map[string]map[string]prop{
		"storageClass.parameters":            s.Properties.StorageClass.Properties.Parameters.Properties,
		"volumeAttributesClasses.parameters": s.Properties.VolumeAttributesClasses.Items.Properties.Parameters.Properties,
	} {
		var got, gotRates []string
		for k, p := range props {
			if strings.HasPrefix(p.Ref, "#/definitions/qos") {
				got = append(got, k)
			}
			if p.Ref == rateRef {
				gotRates = append(gotRates, k)
			}
		}
		if want := slices.Sorted(maps.Keys(rateParams)); !slices.Equal(slices.Sorted(slices.Values(gotRates)), want) {
			t.Errorf("%s: rate keys %v, want %v", where, slices.Sorted(slices.Values(gotRates)), want)
		}
		for k := range scrubParams { // each scrub key with its own definition, of its name
			if want := "#/definitions/" + k; props[k].Ref != want {
				t.Errorf("%s.%s: $ref %q, want %q", where, k, props[k].Ref, want)
			}
		}
		if want := slices.Sorted(maps.Keys(limitParams)); !slices.Equal(slices.Sorted(slices.Values(got)), want) {
			t.Errorf("%s: limit keys %v, want %v", where, slices.Sorted(slices.Values(got)), want)
		}
		for k, lp := range limitParams {
			if props[k].Ref != refs[lp.bytes] {
				t.Errorf("%s.%s: $ref %q, want %q", where, k, props[k].Ref, refs[lp.bytes])
			}
		}
	}
	samples := []string{"0", "1", "1000", "1k", "1K", "1.5", "0.5", "1.5Gi", "100Mi", "50M", "16Ki", "1e3", "-1", "lots", "10 Mi", ""}
	for bytes, ref := range refs {
		def := s.Definitions[strings.TrimPrefix(ref, "#/definitions/")]
		re, err := regexp.Compile(def.Pattern)
		if err != nil {
			t.Fatalf("%s: pattern %q: %v", ref, def.Pattern, err)
		}
		key := ParamMaxWriteIOPS
		if bytes {
			key = ParamMaxWriteBytesPerSecond
		}
		for _, v := range samples {
			if !re.MatchString(v) {
				continue
			}
			if _, err := setLimit(&v1alpha1.VolumeLimits{}, key, v); err != nil {
				t.Errorf("%s: the chart takes %q, the parser refuses it: %v", ref, v, err)
			}
		}
	}
	re, err := regexp.Compile(s.Definitions[strings.TrimPrefix(rateRef, "#/definitions/")].Pattern)
	if err != nil {
		t.Fatalf("%s: %v", rateRef, err)
	}
	for _, v := range samples {
		if !re.MatchString(v) {
			continue
		}
		if _, err := setRate(&v1alpha1.VolumeRates{}, ParamScrubRateMax, v); err != nil {
			t.Errorf("%s: the chart takes %q, the parser refuses it: %v", rateRef, v, err)
		}
	}
	// The scrub keys' patterns: what the chart takes, the parser takes.
	scrubSamples := []string{"", "0", "00:00", "23:59", "24:00", "1:00", "02:30", "0m", "1m", "59m", "60m", "90m", "1439m",
		"1440m", "1h", "1h30m", "1h0m", "23h59m", "24h", "25h", "24h1m", "0h", "4h", "1.5h", "1h60m"}
	for _, k := range []string{ParamScrubStart, ParamScrubWindow} {
		re, err := regexp.Compile(s.Definitions[k].Pattern)
		if err != nil || s.Definitions[k].Pattern == "" {
			t.Fatalf("definition %s: pattern %q: %v", k, s.Definitions[k].Pattern, err)
		}
		for _, v := range scrubSamples {
			if !re.MatchString(v) {
				continue
			}
			if _, err := setScrub(&v1alpha1.VolumeScrubSchedule{}, k, v); err != nil {
				t.Errorf("%s: the chart takes %q, the parser refuses it: %v", k, v, err)
			}
		}
	}
}
