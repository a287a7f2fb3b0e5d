//! The client libraries as `packaging/build` ships them (its `clients/`
//! directory, from `packaging/clients`), used as a new user would: each
//! README example (the code block after `<!-- client-example: LANG -->` in
//! README.md) runs against `holdfastctl dev --detach`, from the built
//! artifact and nothing else of the checkout: `go get` of the module from
//! the module proxy directory, `pip install` of the wheel into a new venv,
//! and `mvn install:install-file` of the jar and its pom into an empty local
//! repository. Each takes `demo/report` and prints its redacted token.

use holdfast_tests::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("workspace")
}

/// The workspace's version (the clients' too: packaging/clients checks).
fn version() -> String {
    let text = std::fs::read_to_string(workspace().join("Cargo.toml")).expect("Cargo.toml");
    let package = text.split_once("[workspace.package]").expect("[workspace.package]").1;
    let line = package.lines().find_map(|l| l.strip_prefix("version = ")).expect("its version");
    line.trim_matches('"').to_string()
}

/// HOLDFAST_PACKAGES_DIR/clients (what scripts/test built once), else
/// built here by packaging/clients.
fn clients(dir: &Path) -> PathBuf {
    if let Some(out) = std::env::var_os("HOLDFAST_PACKAGES_DIR") {
        return PathBuf::from(out).join("clients");
    }
    let out = dir.join("clients");
    let built = Ran::of(Command::new(workspace().join("packaging/clients")).arg(&out));
    assert_eq!(built.code, 0, "packaging/clients:\n{built}");
    out
}

/// The README's example for `lang`.
fn readme_example(lang: &str) -> String {
    let readme = std::fs::read_to_string(workspace().join("README.md")).expect("README.md");
    let marker = format!("<!-- client-example: {lang} -->\n```{lang}\n");
    let start = readme.find(&marker).unwrap_or_else(|| panic!("README.md has no {marker:?}")) + marker.len();
    let end = readme[start..].find("```\n").expect("the example's closing fence");
    readme[start..start + end].to_string()
}

fn run(what: &str, cmd: &mut Command) -> Ran {
    let ran = Ran::of(cmd);
    assert_eq!(ran.code, 0, "{what}:\n{ran}");
    ran
}

/// What every example prints: the key held, the token redacted.
fn assert_held(lang: &str, ran: &Ran) {
    // From the text on: Maven 3.8 puts an ANSI reset before lines even in batch mode.
    let line = ran.stdout.lines().find_map(|l| l.find("holding demo/report").map(|i| &l[i..])).unwrap_or_else(|| panic!("{lang}: {ran}"));
    let may_start = line.ends_with("may start: true") || line.ends_with("may start: True");
    assert!(line.contains("<redacted token>") && may_start, "{lang}: {line}");
    eprintln!("{lang}: {line}");
}

fn go_example(dir: &Path, clients: &Path, env: &HashMap<String, String>) {
    let go = holdfast_devkit::process::which("go").expect("go is not installed");
    let module = dir.join("go-example");
    std::fs::create_dir_all(&module).expect("go-example");
    std::fs::write(module.join("go.mod"), "module example.com/readme\n\ngo 1.26\n").expect("go.mod");
    let body: String = readme_example("go").lines().map(|l| format!("\t{l}\n")).collect();
    std::fs::write(
        module.join("main.go"),
        format!(
            "package main\n\nimport (\n\t\"context\"\n\t\"fmt\"\n\t\"log\"\n\t\"time\"\n\n\tholdfast \"github.com/holdfast-dev/holdfast/clients/go\"\n)\n\nfunc main() {{\n\tctx := context.Background()\n{body}}}\n"
        ),
    )
    .expect("main.go");
    // An empty module cache, so the module can come only from the archive;
    // its dependencies from the tests' shared cache (itself a module proxy
    // directory), else the network.
    let target = cargo_target_dir();
    let shared = target.join("go/path/pkg/mod/cache/download");
    let proxy = format!("file://{},file://{},https://proxy.golang.org", clients.join("go").display(), shared.display());
    let go_cmd = |args: &[&str]| {
        let mut c = Command::new(&go);
        c.args(args)
            .current_dir(&module)
            .env("GOPROXY", &proxy)
            .env("GONOSUMDB", "github.com/holdfast-dev/holdfast")
            .env("GOFLAGS", "-mod=mod -modcacherw")
            .env("GOMODCACHE", dir.join("go-modcache"))
            .env("GOCACHE", target.join("go/cache"))
            .env("GOTOOLCHAIN", "local")
            .envs(env);
        c
    };
    run("go get", &mut go_cmd(&["get", &format!("github.com/holdfast-dev/holdfast/clients/go@v{}", version())]));
    let ran = run("go run", &mut go_cmd(&["run", "."]));
    assert_held("go", &ran);
}

fn python_example(dir: &Path, clients: &Path, env: &HashMap<String, String>) {
    let python3 = holdfast_devkit::process::which("python3").expect("python3 is not installed");
    let venv = dir.join("py-example");
    run("python3 -m venv", Command::new(python3).args(["-m", "venv"]).arg(&venv));
    let wheel = clients.join(format!("python/holdfast_client-{}-py3-none-any.whl", version()));
    assert!(wheel.exists(), "{} is missing", wheel.display());
    let py = venv.join("bin/python");
    run("pip install the wheel", Command::new(&py).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"]).arg(&wheel));
    let ran = run("python", Command::new(&py).arg("-c").arg(readme_example("python")).current_dir(dir).envs(env));
    assert_held("python", &ran);
}

fn java_example(dir: &Path, clients: &Path, env: &HashMap<String, String>) {
    let mvn = holdfast_devkit::process::which("mvn").expect("mvn is not installed (apt-get install maven openjdk-17-jdk-headless)");
    let v = version();
    // An empty local repository: the client comes only from the packaged jar
    // and pom, its dependencies from Maven Central.
    let m2 = dir.join("m2");
    let mvn_cmd = |project: &Path| {
        let mut c = Command::new(&mvn);
        c.arg("-B").arg("-q").arg(format!("-Dmaven.repo.local={}", m2.display())).current_dir(project);
        c
    };
    let jar = clients.join(format!("java/holdfast-client-{v}.jar"));
    let pom = clients.join(format!("java/holdfast-client-{v}.pom"));
    run(
        "mvn install:install-file",
        mvn_cmd(dir)
            .arg("org.apache.maven.plugins:maven-install-plugin:3.1.4:install-file")
            .arg(format!("-Dfile={}", jar.display()))
            .arg(format!("-DpomFile={}", pom.display())),
    );
    let project = dir.join("java-example");
    let src = project.join("src/main/java");
    std::fs::create_dir_all(&src).expect("java-example");
    std::fs::write(
        project.join("pom.xml"),
        format!(
            r#"<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>example</groupId>
  <artifactId>readme</artifactId>
  <version>1</version>
  <properties>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
    <maven.compiler.release>17</maven.compiler.release>
  </properties>
  <dependencies>
    <dependency><groupId>dev.holdfast</groupId><artifactId>holdfast-client</artifactId><version>{v}</version></dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-resources-plugin</artifactId><version>3.3.1</version></plugin>
      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-compiler-plugin</artifactId><version>3.14.0</version></plugin>
    </plugins>
  </build>
</project>
"#
        ),
    )
    .expect("pom.xml");
    let body: String = readme_example("java").lines().map(|l| format!("        {l}\n")).collect();
    std::fs::write(
        src.join("Readme.java"),
        format!(
            "import dev.holdfast.client.*;\nimport java.time.Duration;\n\npublic class Readme {{\n    public static void main(String[] args) {{\n{body}    }}\n}}\n"
        ),
    )
    .expect("Readme.java");
    let ran = run(
        "mvn compile exec:java",
        mvn_cmd(&project).envs(env).args(["compile", "org.codehaus.mojo:exec-maven-plugin:3.6.1:java", "-Dexec.mainClass=Readme"]),
    );
    assert_held("java", &ran);
}

#[test]
fn each_readme_client_example_runs_from_its_package_against_the_dev_appliance() {
    let dir = TestDir::new("client-packages");
    let clients = clients(&dir.path);
    let sums = run("sha256sum -c", Command::new("sha256sum").args(["-c", "SHA256SUMS"]).current_dir(&clients));
    eprintln!("{}", sums.stdout);
    let state = dir.path.join("hf");
    let (_banner, _stop) = dev_detach(&state);
    let env = env_file(&state.join("env"));
    go_example(&dir.path, &clients, &env);
    python_example(&dir.path, &clients, &env);
    java_example(&dir.path, &clients, &env);
}
