//! nginx, one worker: `map $http_x_gray_lane` chooses an upstream block per lane, keep-alive
//! to the upstreams, `/svc` stripped by a rewrite.

use std::ffi::OsString;

use super::{Kind, Launch, Program, Setup, check, render, write};
use crate::bench::{Result, procfs, settings::Settings};

/// nginx's configuration. `{master}` is `off` under callgrind, so that the one process left
/// is the worker, the one counted.
const TEMPLATE: &str = r#"daemon off;
master_process {master};
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;

events {
    worker_connections 4096;
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

/// The `nginx` target.
#[derive(Debug)]
pub(crate) struct Nginx;

impl Kind for Nginx {
    fn name(&self) -> &'static str {
        "nginx"
    }

    fn about(&self) -> &'static str {
        "nginx, one worker, `map $http_x_gray_lane` choosing an upstream block per lane,\n\
         keep-alive to the upstreams, /svc stripped by a rewrite"
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
