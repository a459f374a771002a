//! nginx, one worker: `map $http_x_gray_lane` chooses an upstream block per lane, keep-alive
//! to the upstreams, `/svc` stripped by a rewrite; `nginx-tls` also terminates TLS (TLS 1.2
//! and 1.3, ALPN h2 and http/1.1, stateless session tickets: nginx's defaults, as the
//! gateway's).

use std::ffi::OsString;

use super::{Kind, Launch, Program, Setup, check, render, write};
use crate::bench::{Result, procfs, settings::Settings};

/// nginx's configuration. `{master}` is `off` under callgrind, so that the one process left
/// is the worker, the one counted.
const TEMPLATE: &str = r#"daemon off;
master_process {master};
worker_processes 1;
worker_rlimit_nofile 20000;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;

events {
    worker_connections 16384;
}

http {
    access_log off;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    keepalive_requests 1000000;

    map $http_x_gray_lane $pool {
        default baseline;
        gray    gray;
    }

    upstream baseline {
        server {base1};
        server {base2};
        keepalive 64;
        keepalive_requests 1000000;
    }

    upstream gray {
        server {gray1};
        server {gray2};
        keepalive 64;
        keepalive_requests 1000000;
    }

    server {
        listen {listen};
{tls}
        location /svc/ {
            # proxy_pass with a variable takes no URI part: strip /svc with a rewrite.
            rewrite ^/svc(/.*)$ $1 break;
            proxy_pass http://$pool;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
"#;

/// The TLS listener of `nginx-tls`, in the server block.
const TLS: &str = "        listen {listen} ssl http2;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
";

/// The `nginx` and `nginx-tls` targets.
#[derive(Debug)]
pub(crate) struct Nginx {
    tls: bool,
}

impl Nginx {
    pub(crate) const PLAIN: Nginx = Nginx { tls: false };
    pub(crate) const TLS: Nginx = Nginx { tls: true };
}

impl Kind for Nginx {
    fn name(&self) -> &'static str {
        if self.tls { "nginx-tls" } else { "nginx" }
    }

    fn about(&self) -> &'static str {
        if self.tls {
            "nginx as `nginx`, also terminating TLS (the run's certificate; TLS 1.2 and 1.3,\n\
             ALPN h2 and http/1.1): wrk loads the TLS listener"
        } else {
            "nginx, one worker, `map $http_x_gray_lane` choosing an upstream block per lane,\n\
             keep-alive to the upstreams, /svc stripped by a rewrite"
        }
    }

    fn tls(&self) -> bool {
        self.tls
    }

    fn program(&self, _: &Settings) -> Program {
        Program::System {
            command: "nginx",
            package: "nginx",
        }
    }

    fn configure(&self, setup: &Setup<'_>) -> Result<Launch> {
        let master = if setup.one_process { "off" } else { "on" };
        let prefix = setup.dir.display().to_string();
        let mut values = vec![
            ("master", master.to_owned()),
            ("prefix", prefix),
            ("listen", setup.listen.to_string()),
        ];
        let tls = match setup.tls {
            Some(tls) => render(
                TLS,
                &[
                    ("listen", tls.listen.to_string()),
                    ("cert", tls.cert.display().to_string()),
                    ("key", tls.key.display().to_string()),
                ],
            )?,
            None => String::new(),
        };
        values.push(("tls", tls));
        values.extend(setup.upstreams.values());
        let config = setup.dir.join("nginx.conf");
        write(&config, &render(TEMPLATE, &values)?)?;
        let args: Vec<OsString> = vec![
            "-p".into(),
            setup.dir.into(),
            "-c".into(),
            config.clone().into(),
            "-e".into(),
            setup.dir.join("error.log").into(),
        ];
        let mut test = vec![OsString::from("-t"), "-q".into()];
        test.extend(args.iter().cloned());
        check(setup.program, &test, &config)?;
        Ok(Launch {
            args,
            env: Vec::new(),
            describe: format!("worker_processes 1, master_process {master}"),
        })
    }

    /// The master and its workers.
    fn cpu_pids(&self, pid: u32) -> Vec<u32> {
        let mut pids = vec![pid];
        pids.extend(procfs::children(pid));
        pids
    }

    /// The worker (the master itself with `master_process off`).
    fn serving_pids(&self, pid: u32) -> Vec<u32> {
        let workers = procfs::children(pid);
        if workers.is_empty() {
            vec![pid]
        } else {
            workers
        }
    }
}
