import { defineConfig } from 'vite';
import react from '@vitejs/plugin-react';

// The build is embedded in the Go binaries (web/assets.go), served at the URL root by `agentloop dev` and by the
// API function. `base: './'` keeps asset URLs relative so the same files work under any prefix.
export default defineConfig({
  plugins: [react()],
  base: './',
  // dist/app, not dist: web/dist/README.md is committed so that go:embed has a file before the first build.
  build: { outDir: 'dist/app', emptyOutDir: true, sourcemap: false },
});
