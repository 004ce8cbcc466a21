// mpirun command construction and program/model lookup (ui/worker_command.h).
#include <QtTest>

#include "app/launcher/launch.h"
#include "ui/worker_command.h"

using namespace dit::ui;

class TestCommand : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void init() {
    qunsetenv("DITSTUDIO_MPIRUN");
    qunsetenv("DITSTUDIO_WORKER");
    qunsetenv("DITSTUDIO_MODEL_DIR");
  }

  void plainCpu() {
    LaunchConfig c;
    c.strategy.world = 2;
    c.strategy.ring_degree = 2;
    c.modelDir = "/models/tiny-flux";
    c.workerPath = "/opt/ditstudio/bin/ditstudio-worker";
    const LaunchCommand cmd = buildLaunchCommand(c);
    QCOMPARE(cmd.program, QString("mpirun"));
    QStringList expected = {"--allow-run-as-root",
                            "--oversubscribe",
                            "-np",
                            "2",
                            "--mca",
                            "pml",
                            "ob1",
                            "--mca",
                            "btl",
                            "^tcp,ofi,openib,usnic,uct"};
    // This host's thread placement for 2 ranks x 1 thread (tested in test_protocol).
    for (const auto& a : dit::launcher::threadPlacementArgs(2, 1, dit::launcher::availableCores()))
      expected << QString::fromStdString(a);
    expected << QStringList{"-x",
                            "OMP_NUM_THREADS=1",
                            "/opt/ditstudio/bin/ditstudio-worker",
                            "--model",
                            "/models/tiny-flux",
                            "--tp-degree",
                            "1",
                            "--ring-degree",
                            "2",
                            "--ulysses-degree",
                            "1",
                            "--cfg-degree",
                            "1",
                            "--dp-degree",
                            "1",
                            "--device",
                            "cpu"};
    QCOMPARE(cmd.arguments, expected);
  }

  void everyOption() {
    LaunchConfig c;
    c.strategy.world = 16;
    c.strategy.dp_degree = 2;
    c.strategy.cfg_degree = 2;
    c.strategy.ulysses_degree = 2;
    c.strategy.tp_degree = 2;
    c.strategy.ulysses_anything = true;
    c.strategy.ring_anything = true;  // not a valid combination, but the flags are passed as set
    c.strategy.device = "cuda";
    c.modelDir = "/m/FLUX.1 dev";
    c.hostfile = " /etc/mpi hosts ";
    c.workerPath = "/w";
    c.mpirunPath = "/usr/local/bin/mpirun";
    c.extraWorkerArgs = {"--dtype", "bfloat16"};
    c.hosts.networkInterface = " 10.0.0.0/24 ";
    c.hosts.portRange = "50000-50099";
    c.hosts.sshOptions = "-i /k -p 2222";
    c.hosts.mpirunArgs = "--report-bindings  --display-map";
    const LaunchCommand cmd = buildLaunchCommand(c);
    QCOMPARE(cmd.program, QString("/usr/local/bin/mpirun"));
    // A hostfile group: no --oversubscribe, no binding, ssh never prompts; the network settings;
    // the product's own environment variables forwarded to every rank.
    QStringList expected = {"--allow-run-as-root",
                            "-np",
                            "16",
                            "--hostfile",
                            "/etc/mpi hosts",
                            "--bind-to",
                            "none",
                            "--mca",
                            "plm_rsh_args",
                            "-o BatchMode=yes -o ConnectTimeout=10 -i /k -p 2222",
                            "--mca",
                            "btl_tcp_if_include",
                            "10.0.0.0/24",
                            "--mca",
                            "oob_tcp_if_include",
                            "10.0.0.0/24",
                            "--mca",
                            "oob_tcp_dynamic_ipv4_ports",
                            "50000-50024",
                            "--mca",
                            "btl_tcp_port_min_v4",
                            "50025",
                            "--mca",
                            "btl_tcp_port_range_v4",
                            "75",
                            "-x",
                            "OMP_NUM_THREADS=1"};
    for (const std::string& n : dit::launcher::forwardedEnvironment())
      expected << "-x" << QString::fromStdString(n);
    expected << "--report-bindings"
             << "--display-map";
    expected += QStringList{"/w",
                            "--model",
                            "/m/FLUX.1 dev",
                            "--tp-degree",
                            "2",
                            "--ring-degree",
                            "1",
                            "--ulysses-degree",
                            "2",
                            "--ulysses-anything",
                            "--ring-anything",
                            "--cfg-degree",
                            "2",
                            "--dp-degree",
                            "2",
                            "--device",
                            "cuda",
                            "--dtype",
                            "bfloat16"};
    QCOMPARE(cmd.arguments, expected);
    // Without a hostfile the settings do nothing: the group stays on this host (loopback).
    c.hostfile = "";
    QVERIFY(!buildLaunchCommand(c).arguments.join(' ').contains("10.0.0.0/24"));
    QVERIFY(!buildLaunchCommand(c).arguments.join(' ').contains("BatchMode"));
    QVERIFY(buildLaunchCommand(c).arguments.contains("--oversubscribe"));
    // A malformed port range is refused (the controller logs it and does not start).
    c.hostfile = "/h";
    c.hosts.portRange = "80-90";
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, buildLaunchCommand(c));
    // Display quotes what needs quoting.
    QVERIFY(cmd.display().contains("'/m/FLUX.1 dev'"));
    QVERIFY(cmd.display().startsWith("/usr/local/bin/mpirun --allow-run-as-root"));
  }

  void environmentOverrides() {
    qputenv("DITSTUDIO_MPIRUN", "/opt/openmpi/bin/mpirun");
    qputenv("DITSTUDIO_WORKER", "/tmp/my-worker");
    LaunchConfig c;
    c.modelDir = "/m";
    const LaunchCommand cmd = buildLaunchCommand(c);
    QCOMPARE(cmd.program, QString("/opt/openmpi/bin/mpirun"));
    QVERIFY(cmd.arguments.contains("/tmp/my-worker"));
    QCOMPARE(cmd.arguments.at(cmd.arguments.indexOf("-np") + 1), QString("1"));
  }

  void siblingLookup() {
    const QString exeDir = QCoreApplication::applicationDirPath();
    QCOMPARE(defaultWorkerPath(), QDir(exeDir).filePath("ditstudio-worker"));
    QCOMPARE(siblingExecutable("ditstudio-cli"), QDir(exeDir).filePath("ditstudio-cli"));
    LaunchConfig c;
    c.modelDir = "/m";
    QVERIFY(buildLaunchCommand(c).arguments.contains(QDir(exeDir).filePath("ditstudio-worker")));
  }

  void defaultModel() {
    QCOMPARE(defaultModelDirFor("/usr/bin"), QString("/usr/share/ditstudio/models/tiny-flux"));
    QCOMPARE(defaultModelDirFor("/work/build/bin"),
             QString("/work/build/share/ditstudio/models/tiny-flux"));
    qputenv("DITSTUDIO_MODEL_DIR", "/data/models/flux-dev");
    QCOMPARE(defaultModelDirFor("/usr/bin"), QString("/data/models/flux-dev"));
    QCOMPARE(defaultModelDir(), QString("/data/models/flux-dev"));
  }
};

QTEST_GUILESS_MAIN(TestCommand)
#include "test_ui_command.moc"
