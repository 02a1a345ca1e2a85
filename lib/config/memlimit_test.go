package config

import "testing"

// The Go runtime's memory limit follows the function's memory size unless GOMEMLIMIT says otherwise (issue 18
// item 6: a reply within a 128 MB function).
func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		local   int64
		want    int64
		wantErr bool
	}{
		{name: "not in Lambda", env: map[string]string{}},
		{name: "128 MB function", env: map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128"}, want: 128 << 20 * 80 / 100},
		{name: "1024 MB function", env: map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1024"}, want: 1024 << 20 * 80 / 100},
		{name: "GOMEMLIMIT wins", env: map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128", "GOMEMLIMIT": "60MiB"}},
		{name: "GOMEMLIMIT off wins", env: map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128", "GOMEMLIMIT": "off"}},
		{name: "dev, as the smallest function", local: 128, env: map[string]string{}, want: 128 << 20 * 80 / 100},
		{name: "dev, GOMEMLIMIT wins", local: 128, env: map[string]string{"GOMEMLIMIT": "1GiB"}},
		{name: "dev, GOMEMLIMIT off wins", local: 128, env: map[string]string{"GOMEMLIMIT": "off"}},
		{name: "the function's size wins over a local one", local: 128, env: map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1024"}, want: 1024 << 20 * 80 / 100},
		{name: "garbage", env: map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "lots"}, wantErr: true},
		{name: "with a unit", env: map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128MB"}, wantErr: true},
		{name: "zero", env: map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "0"}, wantErr: true},
		{name: "negative", env: map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "-128"}, wantErr: true},
		{name: "overflowing", env: map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "99999999999999"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, from, err := MemoryLimit(func(k string) string { return tt.env[k] }, tt.local)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("MemoryLimit = %d (%q), %v; want %d, error %v", got, from, err, tt.want, tt.wantErr)
			}
			if got > 0 && from == "" {
				t.Errorf("a limit of %d without what it came from", got)
			}
		})
	}
}
