//! What every mode drives: the temp directory, the processes (pinned, logged, stopped at the
//! end), the upstreams, the configured targets, routing checks and load.

use std::{
    collections::BTreeMap,
    ffi::OsString,
    fs::{self, File},
    net::{SocketAddr, TcpListener},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::OnceLock,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use super::{
    Result,
    kinds::{Kind, Launch, Setup, Tls, Upstreams},
    options::Options,
    probe,
    settings::Settings,
    step,
    tools::Builds,
    wrk::{self, Summary},
};

/// The name of the upstreams' process.
pub(crate) const UPSTREAMS: &str = "upstreams";

// === impl TempDir ===

/// The run's directory: configurations, logs, dumps. Mode 755: nginx's workers run as
/// `nobody` when started as root.
#[derive(Debug)]
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// A new directory `bench-gateway.<pid>.<n>` under `TMPDIR` (or /tmp).
    pub(crate) fn new() -> Result<Self> {
        let base = std::env::var_os("TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        for attempt in 0..100u32 {
            let path = base.join(format!(
                "bench-gateway.{}.{}",
                std::process::id(),
                nanos.wrapping_add(attempt)
            ));
            match fs::create_dir(&path) {
                Ok(()) => {
                    fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
                        .map_err(|e| format!("cannot chmod {}: {e}", path.display()))?;
                    return Ok(TempDir { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
            }
        }
        Err(format!(
            "cannot create a directory under {}",
            base.display()
        ))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the directory, or says where it is kept.
    pub(crate) fn close(self, keep: bool) {
        if keep {
            eprintln!(
                "bench-gateway: logs and configs kept in {}",
                self.path.display()
            );
        } else if let Err(e) = fs::remove_dir_all(&self.path) {
            eprintln!("bench-gateway: cannot remove {}: {e}", self.path.display());
        }
    }
}

// === impl Processes ===

/// The processes the run started, by name, each with its log file. Dropping it stops them
/// all (SIGTERM, then SIGKILL after 5 s).
#[derive(Debug)]
pub(crate) struct Processes {
    dir: PathBuf,
    running: BTreeMap<String, Child>,
}

impl Processes {
    fn new(dir: &Path) -> Self {
        Processes {
            dir: dir.to_owned(),
            running: BTreeMap::new(),
        }
    }

    /// The log of process `name`.
    pub(crate) fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    /// Starts `program args` pinned to CPU `cpu` as process `name`, its output to its log.
    pub(crate) fn start(
        &mut self,
        name: &str,
        cpu: u64,
        program: &Path,
        args: &[OsString],
        env: &[(&str, String)],
    ) -> Result<u32> {
        if self.running.contains_key(name) {
            return Err(format!("{name} is already running"));
        }
        let path = self.log(name);
        let log =
            File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let err = log
            .try_clone()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        // setpriv and taskset exec the program: the child's pid is the program's.
        let mut command = if parent_death_signal() {
            let mut setpriv = Command::new("setpriv");
            setpriv.args(["--pdeathsig", "TERM", "--", "taskset"]);
            setpriv
        } else {
            Command::new("taskset")
        };
        let child = command
            .arg("-c")
            .arg(cpu.to_string())
            .arg(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {name} ({}): {e}", program.display()))?;
        let pid = child.id();
        self.running.insert(name.to_owned(), child);
        Ok(pid)
    }

    /// The pid of process `name`.
    pub(crate) fn pid(&self, name: &str) -> Result<u32> {
        self.running
            .get(name)
            .map(Child::id)
            .ok_or_else(|| format!("{name} is not running"))
    }

    /// Fails with the end of its log when process `name` is no longer running.
    pub(crate) fn alive(&mut self, name: &str, when: &str) -> Result<()> {
        let exited = match self.running.get_mut(name) {
            Some(child) => child.try_wait().ok().flatten(),
            None => return Err(format!("{name} is not running {when}")),
        };
        match exited {
            None => Ok(()),
            Some(status) => Err(format!(
                "{name} died {when} ({status}); the end of its log:\n{}",
                self.tail(name)
            )),
        }
    }

    /// Waits for process `name` to exit by itself, within `limit`.
    pub(crate) fn wait(&mut self, name: &str, limit: Duration) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        let child = self
            .running
            .get_mut(name)
            .ok_or_else(|| format!("{name} is not running"))?;
        loop {
            if let Some(status) = child.try_wait().map_err(|e| format!("{name}: {e}"))? {
                self.running.remove(name);
                return Ok(status);
            }
            if Instant::now() > deadline {
                return Err(format!("{name} did not exit within {} s", limit.as_secs()));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops process `name`: SIGTERM, then SIGKILL after 10 s.
    pub(crate) fn stop(&mut self, name: &str) {
        if let Some(mut child) = self.running.remove(name) {
            terminate(&child);
            reap(&mut child, Duration::from_secs(10));
        }
    }

    /// The last 30 lines of process `name`'s log.
    pub(crate) fn tail(&self, name: &str) -> String {
        let path = self.log(name);
        let text = fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        if lines.is_empty() {
            return format!("({} is empty)", path.display());
        }
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in self.running.values() {
            terminate(child);
        }
        for child in self.running.values_mut() {
            reap(child, Duration::from_secs(5));
        }
    }
}

/// Whether `setpriv --pdeathsig` works here (util-linux 2.33 and later): the processes the
/// bench starts then get SIGTERM when it dies, however it dies (std cannot catch signals,
/// so `Drop` does not run on SIGTERM or SIGKILL).
fn parent_death_signal() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        Command::new("setpriv")
            .args(["--pdeathsig", "TERM", "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// SIGTERM (std's `Child::kill` is SIGKILL, which would leave nginx's workers behind).
fn terminate(child: &Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Waits up to `limit` for `child` to exit, then kills it.
fn reap(child: &mut Child, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

// === impl Target ===

/// A configured target.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) label: String,
    pub(crate) kind: &'static dyn Kind,
    pub(crate) program: PathBuf,
    pub(crate) listen: SocketAddr,
    /// Its TLS listener, for the kinds that terminate TLS (wrk loads it).
    pub(crate) tls: Option<SocketAddr>,
    launch: Launch,
}

impl Target {
    /// What wrk loads.
    pub(crate) fn url(&self) -> String {
        match self.tls {
            Some(tls) => format!("https://{tls}/svc/bench"),
            None => format!("http://{}/svc/bench", self.listen),
        }
    }
}

// === impl Bench ===

/// A run in progress: the upstreams are up and the targets configured (not started).
#[derive(Debug)]
pub(crate) struct Bench<'a> {
    pub(crate) options: &'a Options,
    pub(crate) settings: &'a Settings,
    pub(crate) dir: PathBuf,
    pub(crate) targets: Vec<Target>,
    pub(crate) procs: Processes,
    lua: PathBuf,
    /// How long a routing check request may take.
    probe_timeout: Duration,
    /// How long a target may take to answer its first request.
    startup: Duration,
}

impl<'a> Bench<'a> {
    /// Starts the upstreams and configures every target.
    pub(crate) fn new(options: &'a Options, dir: &TempDir, builds: &Builds) -> Result<Self> {
        let settings = &options.settings;
        let slow = options.mode.slow_targets();
        let mut bench = Bench {
            options,
            settings,
            dir: dir.path().to_owned(),
            targets: Vec::new(),
            procs: Processes::new(dir.path()),
            lua: dir.path().join("mixed.lua"),
            probe_timeout: Duration::from_secs(if slow { 10 } else { 2 }),
            startup: Duration::from_secs(if slow { 60 } else { 10 }),
        };
        fs::write(&bench.lua, wrk::mixed_lua(settings.new_connections))
            .map_err(|e| format!("cannot write {}: {e}", bench.lua.display()))?;
        let (cert, key) = (
            bench.dir.join("tls-cert.pem"),
            bench.dir.join("tls-key.pem"),
        );
        if options.targets.iter().any(|t| t.kind.tls()) {
            certificate(&cert, &key)?;
        }

        // Four upstreams, then a listener, an admin port and a TLS port per target.
        let ports = free_ports(4 + 3 * options.targets.len())?;
        let upstreams = Upstreams::new([ports[0], ports[1], ports[2], ports[3]]);
        bench.start_upstreams(&builds.upstream, &upstreams)?;

        for (i, (spec, program)) in options.targets.iter().zip(&builds.programs).enumerate() {
            let own = bench.dir.join(&spec.label);
            fs::create_dir(&own)
                .and_then(|()| fs::set_permissions(&own, fs::Permissions::from_mode(0o755)))
                .map_err(|e| format!("cannot create {}: {e}", own.display()))?;
            let listen = ports[4 + 3 * i];
            let tls = spec.kind.tls().then_some(ports[6 + 3 * i]);
            let launch = spec.kind.configure(&Setup {
                program,
                dir: &own,
                listen,
                admin: ports[5 + 3 * i],
                tls: tls.map(|listen| Tls {
                    listen,
                    cert: &cert,
                    key: &key,
                }),
                upstreams: &upstreams,
                one_process: options.mode.one_process(),
                settings,
            })?;
            bench.targets.push(Target {
                label: spec.label.clone(),
                kind: spec.kind,
                program: program.clone(),
                listen,
                tls,
                launch,
            });
        }
        Ok(bench)
    }

    /// One process serves the four instances: on the CPU it shares with wrk, two processes
    /// switch rather than five, which keeps the load side cheaper than the target it
    /// measures.
    fn start_upstreams(&mut self, program: &Path, upstreams: &Upstreams) -> Result<()> {
        let names: Vec<String> = upstreams
            .all()
            .map(|u| format!("{} :{}", u.id, u.addr.port()))
            .collect();
        step(&format!(
            "upstreams on CPU {}: {}",
            self.settings.load_cpu,
            names.join(", ")
        ));
        let mut args: Vec<OsString> = Vec::new();
        for instance in upstreams.all() {
            args.extend(["--listen".into(), instance.addr.to_string().into()]);
            args.extend(["--id".into(), instance.id.into()]);
        }
        self.procs
            .start(UPSTREAMS, self.settings.load_cpu, program, &args, &[])?;
        for instance in upstreams.all() {
            self.wait_up(UPSTREAMS, instance.addr, "/", Duration::from_secs(10))?;
        }
        Ok(())
    }

    /// Starts target `i` pinned to `PROXY_CPU`, under `wrapper` (a command and its options,
    /// `valgrind --tool=callgrind ...`) when not empty; the caller waits for it.
    pub(crate) fn start_target(&mut self, i: usize, wrapper: &[OsString]) -> Result<u32> {
        let t = &self.targets[i];
        let under = match wrapper.first() {
            Some(program) => format!(" under {}", program.to_string_lossy()),
            None => String::new(),
        };
        step(&format!(
            "{} on CPU {}{under}: {} ({}, {})",
            t.label,
            self.settings.proxy_cpu,
            t.listen,
            t.program.display(),
            t.launch.describe
        ));
        let (program, args) = match wrapper.split_first() {
            Some((wrapper, options)) => {
                let mut args = options.to_vec();
                args.push(t.program.clone().into());
                args.extend(t.launch.args.iter().cloned());
                (PathBuf::from(wrapper), args)
            }
            None => (t.program.clone(), t.launch.args.clone()),
        };
        let (label, env) = (t.label.clone(), t.launch.env.clone());
        self.procs
            .start(&label, self.settings.proxy_cpu, &program, &args, &env)
    }

    /// Waits until target `i` answers 200 on `/svc/`.
    pub(crate) fn wait_target(&mut self, i: usize) -> Result<()> {
        let (label, addr) = (self.targets[i].label.clone(), self.targets[i].listen);
        self.wait_up(&label, addr, "/svc/", self.startup)
    }

    /// Waits until `http://addr{path}` answers 200 (within `limit`), failing with the
    /// process's log if it died.
    fn wait_up(&mut self, name: &str, addr: SocketAddr, path: &str, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            self.procs.alive(name, "during startup")?;
            match probe::get(addr, path, &[], Duration::from_secs(1)) {
                Ok(reply) if reply.status == 200 => return Ok(()),
                _ => thread::sleep(Duration::from_millis(100)),
            }
        }
        Err(format!(
            "{name} did not answer 200 on http://{addr}{path} within {} s; the end of its log:\n{}",
            limit.as_secs(),
            self.procs.tail(name)
        ))
    }

    /// Checks target `i`'s routing: unstained requests to base-*, `x-gray-lane: gray` to
    /// gray-*, `/svc` stripped.
    pub(crate) fn check_target(&self, i: usize) -> Result<()> {
        let t = &self.targets[i];
        let timeout = self.probe_timeout;
        probe::check_lane(&t.label, t.listen, "no header", "base-", &[], timeout)?;
        let stained = [("x-gray-lane", "gray")];
        probe::check_lane(
            &t.label,
            t.listen,
            "x-gray-lane: gray",
            "gray-",
            &stained,
            timeout,
        )?;
        if let Some(tls) = t.tls {
            let cert = self.dir.join("tls-cert.pem");
            probe::check_tls_lane(
                &t.label,
                tls,
                &cert,
                "tls, no header",
                "base-",
                &[],
                timeout,
            )?;
            probe::check_tls_lane(
                &t.label,
                tls,
                &cert,
                "tls, x-gray-lane: gray",
                "gray-",
                &stained,
                timeout,
            )?;
        }
        Ok(())
    }

    /// Starts every target normally, waits for each, checks its routing, and warms each up
    /// for `WARMUP` seconds.
    pub(crate) fn start_all(&mut self) -> Result<()> {
        for i in 0..self.targets.len() {
            self.start_target(i, &[])?;
            self.wait_target(i)?;
        }
        step("routing checks (20 requests per lane)");
        for i in 0..self.targets.len() {
            self.check_target(i)?;
        }
        if self.settings.warmup > 0 {
            step(&format!("warm-up: {}s per target", self.settings.warmup));
            for i in 0..self.targets.len() {
                self.load(i, self.settings.warmup)?;
            }
        }
        Ok(())
    }

    /// One wrk run against target `i` for `seconds`.
    pub(crate) fn load(&self, i: usize, seconds: u64) -> Result<Summary> {
        let s = self.settings;
        wrk::run(
            s.load_cpu,
            s.connections,
            seconds,
            &self.lua,
            &self.targets[i].url(),
        )
        .map_err(|e| format!("{}: {e}", self.targets[i].label))
    }

    /// Fails when the upstreams or any target in `targets` is no longer running.
    pub(crate) fn alive(&mut self, when: &str, targets: &[usize]) -> Result<()> {
        self.procs.alive(UPSTREAMS, when)?;
        for &i in targets {
            let label = self.targets[i].label.clone();
            self.procs.alive(&label, when)?;
        }
        Ok(())
    }

    /// The processes of target `i` whose CPU time counts.
    pub(crate) fn cpu_pids(&self, i: usize) -> Result<Vec<u32>> {
        let t = &self.targets[i];
        Ok(t.kind.cpu_pids(self.procs.pid(&t.label)?))
    }

    /// The processes of target `i` that serve its requests.
    pub(crate) fn serving_pids(&self, i: usize) -> Result<Vec<u32>> {
        let t = &self.targets[i];
        Ok(t.kind.serving_pids(self.procs.pid(&t.label)?))
    }

    /// Stops target `i`.
    pub(crate) fn stop_target(&mut self, i: usize) {
        let label = self.targets[i].label.clone();
        self.procs.stop(&label);
    }

    /// The targets' labels, in order.
    pub(crate) fn labels(&self) -> Vec<&str> {
        self.targets.iter().map(|t| t.label.as_str()).collect()
    }

    /// The reference targets asked for (`--refs`) that run, each with its position among
    /// [`labels`](Self::labels): the columns of the ratios a mode prints.
    pub(crate) fn reference_columns(&self) -> Vec<(usize, &str)> {
        let labels = self.labels();
        self.options
            .refs()
            .into_iter()
            .filter_map(|r| Some((labels.iter().position(|l| *l == r)?, r)))
            .collect()
    }
}

/// Writes the run's TLS certificate and key (a self-signed ECDSA P-256 certificate for
/// 127.0.0.1 and `localhost`, valid two days: what every TLS target serves) with the
/// `openssl` command.
fn certificate(cert: &Path, key: &Path) -> Result<()> {
    let output = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(key)
        .arg("-out")
        .arg(cert)
        .output()
        .map_err(|e| format!("cannot run openssl (Debian: `apt-get install openssl`): {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "openssl could not make the TLS certificate ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    // nginx's workers run as `nobody`; the key is read by the master, but keep it readable.
    fs::set_permissions(key, fs::Permissions::from_mode(0o644))
        .map_err(|e| format!("cannot chmod {}: {e}", key.display()))
}

/// `n` distinct free loopback ports: bound together while chosen so that none repeats, then
/// released for the programs that take a port on their command line (nginx, HAProxy and the
/// gateway cannot inherit a listener).
fn free_ports(n: usize) -> Result<Vec<SocketAddr>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot bind a loopback port: {e}"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map_err(|e| format!("{e}")))
        .collect()
}
