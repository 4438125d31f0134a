// A real tidemark server per test: the binary named by TIDEMARK_BIN (default
// target/debug/tidemark of the workspace), its own data directory, a fixed port so that a
// restart after kill -9 comes back at the same address.
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import net from "node:net";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

export async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

export class Server {
  static async start(config) {
    const s = new Server();
    s.dir = mkdtempSync(join(tmpdir(), "tidemark-ts-"));
    s.port = await freePort();
    s.base = `http://127.0.0.1:${s.port}`;
    if (config) {
      s.config = join(s.dir, "tidemark.toml");
      writeFileSync(s.config, config);
    }
    await s.spawn();
    return s;
  }

  async spawn() {
    const bin = process.env.TIDEMARK_BIN ?? join(root, "target", "debug", "tidemark");
    const args = ["serve", "--data", join(this.dir, "data"), "--listen", `127.0.0.1:${this.port}`];
    if (this.config) args.push("--config", this.config);
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("TIDEMARK_")));
    env.RUST_LOG = "warn";
    this.proc = spawn(bin, args, { env, stdio: ["ignore", "pipe", "ignore"] });
    await new Promise((resolve, reject) => {
      let out = "";
      this.proc.stdout.on("data", (d) => {
        out += d;
        if (out.includes("\n")) {
          if (out.startsWith("listening on")) resolve(); else reject(new Error(`did not start: ${out}`));
        }
      });
      this.proc.on("exit", (c) => reject(new Error(`exited ${c}`)));
    });
    for (let i = 0; i < 600; i++) {
      try {
        if ((await fetch(this.base + "/readyz")).ok) return;
      } catch {}
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error("the server never became ready");
  }

  async kill9() {
    const exited = new Promise((r) => this.proc.once("exit", r));
    this.proc.kill("SIGKILL");
    await exited;
  }

  async restart() {
    await this.spawn();
  }

  async stop() {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) await this.kill9();
    rmSync(this.dir, { recursive: true, force: true });
  }
}
